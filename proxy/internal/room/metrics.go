package room

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the rooms' series, labelled by room (the rule's name, with
// "/<activity>" for a room that takes its sale from the path).
type Metrics struct {
	Waiting   *prometheus.GaugeVec   // places given and not decided yet, plus the pre-queue (last tick)
	Active    *prometheus.GaugeVec   // admitted and not done (last tick)
	Admitted  *prometheus.CounterVec // admissions this instance's ticks made
	Abandoned *prometheus.CounterVec // places skipped: their holder stopped polling
	Expired   *prometheus.CounterVec // admissions that ended by their session
	Finished  *prometheus.CounterVec // admissions ended by a purchase's 202 or 409
	Answers   *prometheus.CounterVec // room, answer: waiting|pre_queue|sold_out|admitted|unavailable|open
	Bad       *prometheus.CounterVec // room, reason: refused tickets
	InLine    *prometheus.HistogramVec
	Calls     *prometheus.CounterVec // room, script: enter|tick|check, result: ok|error
}

// NewMetrics registers the rooms' metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v
	}
	gv := func(name, help string) *prometheus.GaugeVec {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"room"})
		reg.MustRegister(v)
		return v
	}
	m := &Metrics{
		Waiting:   gv("seckill_proxy_room_waiting", "Places in a waiting room's line not decided yet, plus its pre-queue (as this instance last saw it)."),
		Active:    gv("seckill_proxy_room_active", "Clients admitted by a waiting room and not done yet (as this instance last saw it)."),
		Admitted:  cv("seckill_proxy_room_admitted_total", "Admissions made by this instance's steps of a waiting room's line (sum over instances: the room's).", "room"),
		Abandoned: cv("seckill_proxy_room_abandoned_total", "Places skipped because their holder stopped polling (place_ttl).", "room"),
		Expired:   cv("seckill_proxy_room_sessions_expired_total", "Admissions that ended by their session without a purchase's answer.", "room"),
		Finished:  cv("seckill_proxy_room_finished_total", "Admissions ended by a purchase answered 202 or 409.", "room"),
		Answers:   cv("seckill_proxy_room_answers_total", "Requests a waiting room decided, by answer: admitted, waiting, pre_queue, sold_out, unavailable, open (let through: Redis failure).", "room", "answer"),
		Bad:       cv("seckill_proxy_room_bad_tickets_total", "Tickets refused, by reason: malformed, bad_signature, unknown_key, expired, other_room, other_identity, stale.", "room", "reason"),
		InLine: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "seckill_proxy_room_time_in_line_seconds",
			Help:    "From a client's place to its admission.",
			Buckets: []float64{0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800}}, []string{"room"}),
		Calls: cv("seckill_proxy_room_redis_calls_total", "Waiting-room calls to Redis, by script (enter, tick, check, finish) and result.", "room", "script", "result"),
	}
	reg.MustRegister(m.InLine)
	return m
}
