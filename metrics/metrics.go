// Package metrics is the daemon's Prometheus registry: what it counts, and
// the hooks through which the journal, the writer and each principal feed
// it. It is served as Prometheus text on /metrics.
package metrics

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mindroomd/mindroomd/journal"
)

// statusTimeout bounds the journal read a scrape makes.
const statusTimeout = 5 * time.Second

// BacklogFunc reads every principal's backlog from the journal.
type BacklogFunc func(ctx context.Context) ([]journal.Backlog, error)

// Metrics is one daemon's registry.
type Metrics struct {
	reg        *prometheus.Registry
	now        func() time.Time
	admitted   *prometheus.CounterVec
	deliveries *prometheus.CounterVec
	batch      prometheus.Histogram
	commit     prometheus.Histogram
	busyWaits  prometheus.Counter
	hydration  *prometheus.CounterVec
	decrypted  *prometheus.CounterVec
	retained   *prometheus.CounterVec
	reclaimed  prometheus.Counter

	mu       sync.Mutex
	lastSync map[string]*atomic.Int64 // agent -> unix ms of its last admitted sync
}

// New returns a registry whose journal gauges read backlog at each scrape.
func New(backlog BacklogFunc, now func() time.Time) *Metrics {
	if now == nil {
		now = time.Now
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		now: now,
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mindroomd_admitted_events_total",
			Help: "Events admission handled, by agent and outcome (admitted, duplicate, rejected).",
		}, []string{"agent", "outcome"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mindroomd_delivery_steps_total",
			Help: "Steps replies passed, by agent and step (claimed, accepted, acknowledged, adopted).",
		}, []string{"agent", "step"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mindroomd_writer_batch_commands",
			Help:    "Commands per group commit of the journal writer.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mindroomd_writer_commit_seconds",
			Help:    "Time of one writer transaction, BEGIN to the end of COMMIT's sync.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12),
		}),
		busyWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mindroomd_writer_busy_waits_total",
			Help: "Times the writer found another connection holding the write lock and waited.",
		}),
		hydration: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mindroomd_hydration_total",
			Help: "Hydration work by agent, kind (room, thread, refetch) and what was counted (walks, failures, requests, events, chunks).",
		}, []string{"agent", "kind", "counted"}),
		decrypted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mindroomd_decryptions_total",
			Help: "Encrypted events by agent and outcome: ok (decrypted on arrival), late (decrypted once their key came), awaiting (journaled to wait for a key), failed_<reason> (never decryptable).",
		}, []string{"agent", "outcome"}),
		retained: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mindroomd_retention_rows_total",
			Help: "Rows retention pruned, by agent and kind (bodies, edits, payloads, turns, rejected, identities, deliveries, approvals).",
		}, []string{"agent", "kind"}),
		reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mindroomd_retention_reclaimed_bytes_total",
			Help: "Bytes of the journal file retention handed back to the file system (SQLite).",
		}),
		lastSync: make(map[string]*atomic.Int64),
	}
	m.reg.MustRegister(m.admitted, m.deliveries, m.batch, m.commit, m.busyWaits, m.hydration, m.decrypted, m.retained,
		m.reclaimed, journalGauges{backlog: backlog},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Committed is the store's OnCommit hook.
func (m *Metrics) Committed(commands int, took time.Duration) {
	m.batch.Observe(float64(commands))
	m.commit.Observe(took.Seconds())
}

// Busy is the store's OnBusy hook.
func (m *Metrics) Busy(time.Duration) { m.busyWaits.Inc() }

// Agent returns the principal hooks of one agent, and registers its sync
// lag gauge.
func (m *Metrics) Agent(name string) (onSynced func([]journal.AdmitResult), onDelivery func(point string)) {
	last := new(atomic.Int64)
	m.mu.Lock()
	m.lastSync[name] = last
	m.mu.Unlock()
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "mindroomd_sync_lag_seconds",
		Help:        "Seconds since the agent's last sync response was admitted (-1 before the first).",
		ConstLabels: prometheus.Labels{"agent": name},
	}, func() float64 {
		at := last.Load()
		if at == 0 {
			return -1
		}
		return m.now().Sub(time.UnixMilli(at)).Seconds()
	}))
	onSynced = func(results []journal.AdmitResult) {
		last.Store(m.now().UnixMilli())
		for _, r := range results {
			m.admitted.WithLabelValues(name, r.Outcome.String()).Inc()
		}
	}
	onDelivery = func(point string) { m.deliveries.WithLabelValues(name, point).Inc() }
	return onSynced, onDelivery
}

// Walk is what one hydration walk did, as the metrics count it.
type Walk struct {
	// Kind is thread, room or refetch.
	Kind string
	// Requests, Events and Chunks count the homeserver requests made, the
	// events they returned and the transactions that installed them.
	Requests, Events, Chunks int
	// Covered is set when the conversation was already covered and the
	// walk fetched nothing; Failed when it ended in an error.
	Covered, Failed bool
}

// Hydration returns the hydration hook of one agent: it counts the walks
// that fetched, their requests, the events they fetched and the chunks
// they installed. A walk that found its conversation covered fetched
// nothing and is not counted.
func (m *Metrics) Hydration(agent string) func(Walk) {
	return func(w Walk) {
		if w.Covered {
			return
		}
		add := func(counted string, n int) { m.hydration.WithLabelValues(agent, w.Kind, counted).Add(float64(n)) }
		add("walks", 1)
		if w.Failed {
			add("failures", 1)
		}
		add("requests", w.Requests)
		add("events", w.Events)
		add("chunks", w.Chunks)
	}
}

// Decryption returns the hook that counts an agent's encrypted events by
// outcome.
func (m *Metrics) Decryption(agent string) func(outcome string) {
	return func(outcome string) { m.decrypted.WithLabelValues(agent, outcome).Inc() }
}

// Retained counts one agent's retention pass.
func (m *Metrics) Retained(agent string, n journal.RetentionCount) {
	for kind, rows := range map[string]int64{"bodies": n.Bodies, "edits": n.Edits, "payloads": n.Payloads, "turns": n.Turns,
		"rejected": n.Rejected, "identities": n.Identities, "deliveries": n.Deliveries, "approvals": n.Approvals} {
		m.retained.WithLabelValues(agent, kind).Add(float64(rows))
	}
}

// Reclaimed counts bytes handed back to the file system.
func (m *Metrics) Reclaimed(bytes int64) { m.reclaimed.Add(float64(bytes)) }

// Replica registers the gauges of a replica of several: the leases it
// holds, the leases it took, and the writes refused because their lease
// was gone (held, taken and fenced are read at each scrape).
func (m *Metrics) Replica(held func() int, taken, fenced func() int64) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "mindroomd_leases_held",
			Help: "Agents whose lease this replica holds, and so serves.",
		}, func() float64 { return float64(held()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "mindroomd_lease_takeovers_total",
			Help: "Agents' leases this replica took: at start, or from a replica that died, stalled or handed them back.",
		}, func() float64 { return float64(taken()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "mindroomd_fenced_writes_total",
			Help: "Writes refused because this replica did not, or no longer, hold the agent's lease.",
		}, func() float64 { return float64(fenced()) }))
}

// Handler serves the registry as Prometheus text.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// journalGauges reads the journal's backlog at each scrape: pending work,
// and the replies not yet acknowledged by state, per agent.
type journalGauges struct{ backlog BacklogFunc }

var (
	pendingDesc = prometheus.NewDesc("mindroomd_pending_events",
		"Actionable events owed a turn, by agent.", []string{"agent", "user_id"}, nil)
	deliveriesDesc = prometheus.NewDesc("mindroomd_unacknowledged_replies",
		"Replies not yet acknowledged by the homeserver, by agent and state (queued, attempted).",
		[]string{"agent", "user_id", "state"}, nil)
	awaitingDesc = prometheus.NewDesc("mindroomd_events_awaiting_keys",
		"Encrypted events journaled while their keys are missing, by agent.", []string{"agent", "user_id"}, nil)
	journalUpDesc = prometheus.NewDesc("mindroomd_journal_readable",
		"1 when the scrape could read the journal's counts, 0 when it could not.", nil, nil)
)

// Describe implements prometheus.Collector.
func (journalGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- pendingDesc
	ch <- deliveriesDesc
	ch <- awaitingDesc
	ch <- journalUpDesc
}

// Collect implements prometheus.Collector.
func (g journalGauges) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	bs, err := g.backlog(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(journalUpDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(journalUpDesc, prometheus.GaugeValue, 1)
	for _, b := range bs {
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(b.Pending), b.Agent, b.UserID)
		ch <- prometheus.MustNewConstMetric(deliveriesDesc, prometheus.GaugeValue, float64(b.Queued), b.Agent, b.UserID, "queued")
		ch <- prometheus.MustNewConstMetric(deliveriesDesc, prometheus.GaugeValue, float64(b.Attempted), b.Agent, b.UserID, "attempted")
		ch <- prometheus.MustNewConstMetric(awaitingDesc, prometheus.GaugeValue, float64(b.AwaitingKeys), b.Agent, b.UserID)
	}
}
