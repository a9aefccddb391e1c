package broker

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/internal/servicetest"
)

// Send answers each publish with the broker's word: acked (in the queue),
// returned when unroutable (with the reply), and a second publish of an id
// still awaiting its answer is refused rather than confused with it.
func TestConfirmChannelSendAckReturnDuplicate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	topo := f.cfg.Topology
	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	t.Cleanup(func() { _ = conn.Close() })
	cc, err := OpenConfirmChannel(conn, 4)
	servicetest.Must(t, err, "confirm channel")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	msg := amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: "m-1", Body: []byte("x")}
	if err := cc.Send(ctx, topo.Exchange, topo.RoutingKey, msg); err != nil {
		t.Fatalf("send to a bound key: %v", err)
	}
	if got := f.depth(t); got != 1 {
		t.Errorf("queue holds %d messages after an acked send, want 1", got)
	}
	msg.MessageId = "m-2"
	if err := cc.Send(ctx, topo.Exchange, "no-such-key", msg); !errors.Is(err, ErrReturned) {
		t.Errorf("send to an unbound key: %v, want ErrReturned", err)
	}
	if !cc.Track("m-3") {
		t.Fatal("Track of a fresh id refused")
	}
	msg.MessageId = "m-3"
	if err := cc.Send(ctx, topo.Exchange, topo.RoutingKey, msg); !errors.Is(err, ErrDuplicate) {
		t.Errorf("send of an id awaiting its answer: %v, want ErrDuplicate", err)
	}
	cc.Forget("m-3")
	if err := cc.Send(ctx, topo.Exchange, topo.RoutingKey, msg); err != nil {
		t.Errorf("send after Forget: %v", err)
	}
	if n := cc.Pending(); n != 0 {
		t.Errorf("%d publishes still tracked after every answer", n)
	}

	// An untracked publish (no id awaited) that comes back is a stray.
	dc, err := cc.Publish(ctx, topo.Exchange, "no-such-key", amqp.Publishing{Body: []byte("y")})
	servicetest.Must(t, err, "publish untracked")
	if _, err := dc.WaitContext(ctx); err != nil {
		t.Fatal(err)
	}
	if n := cc.Strays(); n != 1 {
		t.Errorf("Strays = %d after one untracked return, want 1", n)
	}
}
