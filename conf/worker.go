package conf

import "time"

// Worker is the [worker] section.
type Worker struct {
	// Listen serves the worker's /healthz, /readyz and /metrics.
	Listen string `toml:"listen"`
	// Consumers is the number of consuming channels in one worker process.
	Consumers int `toml:"consumers"`
	// Prefetch is the QoS of each consumer channel.
	Prefetch int `toml:"prefetch"`
	// BatchSize and BatchWait bound one MySQL transaction.
	BatchSize int      `toml:"batch_size"`
	BatchWait Duration `toml:"batch_wait"`
	// RetryMin and RetryMax bound the back-off while MySQL or Redis fail.
	RetryMin       Duration `toml:"retry_min"`
	RetryMax       Duration `toml:"retry_max"`
	SweepInterval  Duration `toml:"sweep_interval"`
	RepublishAfter Duration `toml:"republish_after"`
	// QueuedExpireAfter bounds the wait of an order whose message the broker
	// confirmed: past its deadline by this much with no MySQL row, the
	// message is taken as gone (the queue deleted; a dead-lettered one is
	// decided by the dead-letter consumer at once) and the order is failed
	// (expired), so no 202 stays pending forever. Longer than any worker
	// outage you ride out. With the reservation TTL it also bounds the
	// recovery after a Redis loss, which the drain marker ends first.
	QueuedExpireAfter Duration `toml:"queued_expire_after"`
	ReconcileInterval Duration `toml:"reconcile_interval"`
	ShutdownGrace     Duration `toml:"shutdown_grace"`
	// DrainDelay is how long /readyz fails after SIGTERM before the worker
	// stops consuming and its listener closes.
	DrainDelay Duration `toml:"drain_delay"`
	// ArchiveInterval is how often the archiver (one worker of the fleet at a
	// time) looks for sales to archive; ArchiveGrace how long after a sale's
	// end it waits; ArchiveSummaryTTL how long the counters of an archived
	// sale stay in Redis (MySQL answers after that).
	ArchiveInterval   Duration `toml:"archive_interval"`
	ArchiveGrace      Duration `toml:"archive_grace"`
	ArchiveSummaryTTL Duration `toml:"archive_summary_ttl"`
	// Partitions lists the order-queue partitions this worker consumes
	// (0 .. rabbitmq.partitions-1); empty: all of them, and also any
	// partition queue left over from a larger rabbitmq.partitions, until
	// it is empty.
	Partitions []int `toml:"partitions"`
}

func defaultWorker() Worker {
	return Worker{
		Listen:            "127.0.0.1:8091",
		Consumers:         1,
		Prefetch:          1000,
		BatchSize:         500,
		BatchWait:         D(25 * time.Millisecond),
		RetryMin:          D(50 * time.Millisecond),
		RetryMax:          D(5 * time.Second),
		SweepInterval:     D(time.Second),
		RepublishAfter:    D(30 * time.Second),
		QueuedExpireAfter: D(6 * time.Hour),
		ReconcileInterval: D(10 * time.Second),
		ShutdownGrace:     D(10 * time.Second),
		ArchiveInterval:   D(30 * time.Second),
		ArchiveGrace:      D(10 * time.Minute),
		ArchiveSummaryTTL: D(24 * time.Hour),
	}
}

func (w *Worker) validate(p *problems) {
	checkListen(p, "worker.listen", w.Listen)
	checkRange(p, "worker.consumers", w.Consumers, 1, 64)
	checkRange(p, "worker.prefetch", w.Prefetch, 1, 65535)
	checkRange(p, "worker.batch_size", w.BatchSize, 1, 5000)
	checkPositive(p, "worker.batch_wait", w.BatchWait)
	checkPositive(p, "worker.retry_min", w.RetryMin)
	checkPositive(p, "worker.retry_max", w.RetryMax)
	checkPositive(p, "worker.sweep_interval", w.SweepInterval)
	checkPositive(p, "worker.republish_after", w.RepublishAfter)
	checkPositive(p, "worker.queued_expire_after", w.QueuedExpireAfter)
	if w.QueuedExpireAfter.Duration > 0 && w.QueuedExpireAfter.Duration < w.RepublishAfter.Duration {
		p.add("worker.queued_expire_after", "must be at least worker.republish_after (%s), got %s", w.RepublishAfter.Duration, w.QueuedExpireAfter.Duration)
	}
	checkPositive(p, "worker.reconcile_interval", w.ReconcileInterval)
	checkPositive(p, "worker.shutdown_grace", w.ShutdownGrace)
	checkNonNegative(p, "worker.drain_delay", w.DrainDelay)
	checkPositive(p, "worker.archive_interval", w.ArchiveInterval)
	checkPositive(p, "worker.archive_grace", w.ArchiveGrace)
	checkPositive(p, "worker.archive_summary_ttl", w.ArchiveSummaryTTL)
	if w.Prefetch < w.BatchSize {
		p.add("worker.prefetch", "must be at least worker.batch_size (%d), got %d", w.BatchSize, w.Prefetch)
	}
}
