package rls

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// ServiceName is the gRPC service Envoy calls (and health checks).
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Server is the gRPC server of a Service: the rate-limit service, the
// gRPC health service, and reflection when asked.
type Server struct {
	grpc   *grpc.Server
	health *health.Server
}

// streamWorkers: about the calls in flight of one busy Envoy fleet on
// this service (each waits for a store call most of its time).
const streamWorkers = 64

// ServerOptions bound the gRPC server.
type ServerOptions struct {
	MaxStreams      uint32
	MaxMessageBytes int
	Reflection      bool
}

// NewServer serves svc.
func NewServer(svc *Service, o ServerOptions) *Server {
	g := grpc.NewServer(
		grpc.MaxConcurrentStreams(o.MaxStreams),
		grpc.MaxRecvMsgSize(o.MaxMessageBytes),
		// Calls run on long-lived workers whose stacks have grown already
		// (a fresh goroutine per call spent a tenth of the CPU growing its
		// stack); past them a call gets a goroutine of its own.
		grpc.NumStreamWorkers(streamWorkers),
		// Envoy keeps its connection to the service open and pings it
		// (grpc_service keepalive); a client pinging faster than every 10s
		// is cut off rather than kept busy.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	pb.RegisterRateLimitServiceServer(g, svc)
	h := health.NewServer()
	h.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, h)
	if o.Reflection {
		reflection.Register(g)
	}
	return &Server{grpc: g, health: h}
}

// Serve serves ln until Stop.
func (s *Server) Serve(ln net.Listener) error { return s.grpc.Serve(ln) }

// Stop reports NOT_SERVING, then lets the calls in flight finish until ctx
// ends, then closes what is left.
func (s *Server) Stop(ctx context.Context) {
	s.health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}

// Watch reloads svc from path when the files change, as the reference
// server watches its directory, until ctx ends. It watches the directory
// (or a file's directory, for editors and ConfigMaps that replace a file by
// renaming another over it) and waits for the writes to settle. stop ends
// the watch and returns once it can reload no more: a SIGHUP that moves
// rls_config elsewhere stops the old watch first, so a late change of the
// old files cannot bring them back.
func Watch(ctx context.Context, svc *Service, path string, log *slog.Logger) (stop func(), err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	dir := path
	if c := svc.Config(); c != nil && len(c.files) == 1 && c.files[0] == path {
		dir = filepath.Dir(path)
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer w.Close()
		const settle = 200 * time.Millisecond
		t := time.NewTimer(time.Hour)
		t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				// Any change of the directory: a ConfigMap swaps its ..data
				// link, never touching the file's own name.
				_ = ev
				t.Reset(settle)
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				log.Warn("rls config watch", "err", err)
			case <-t.C:
				if err := svc.Reload(path); err != nil {
					log.Error("rls config reload rejected, running config kept", "path", path, "err", err)
					continue
				}
				log.Info("rls config reloaded", "path", path, "domains", svc.Config().Domains())
			}
		}
	}()
	return func() { cancel(); <-done }, nil
}
