// Package retention runs a daemon's retention: each agent's pass at start
// and then on its interval, and after a pass that cleared anything, the
// journal file's freed space handed back. What a pass prunes is the
// journal's business (journal.Retention); this package owns when.
package retention

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/journal"
)

// Target is one agent's retention.
type Target struct {
	Agent  string
	Store  journal.Retention
	Policy journal.RetentionPolicy
	// Interval spaces its passes; the first runs at start.
	Interval time.Duration
	// Active, when set, says whether the agent's data is this process's
	// to prune now (a replica prunes only the agents it serves); a pass
	// that finds it inactive waits for the next interval.
	Active func() bool
}

// Deps are what Run needs.
type Deps struct {
	Targets []Target
	// Reclaim hands the journal's freed space back to the file system
	// after a pass that cleared something; nil when the journal needs no
	// help (PostgreSQL's autovacuum). It returns the bytes handed back.
	Reclaim func(ctx context.Context) (int64, error)
	// OnPass learns of every pass that finished: metrics count here.
	OnPass func(agent string, n journal.RetentionCount)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	Log zerolog.Logger
}

// Run runs the targets' passes until ctx ends. A pass that fails is logged
// and tried again at its next interval: nothing retention leaves undone
// is owed to anyone.
func Run(ctx context.Context, d Deps) {
	if len(d.Targets) == 0 {
		return
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	due := make([]time.Time, len(d.Targets))
	for i := range due {
		due[i] = d.Now()
	}
	for {
		cleared := false
		for i, t := range d.Targets {
			if d.Now().Before(due[i]) {
				continue
			}
			due[i] = d.Now().Add(t.Interval)
			if t.Active != nil && !t.Active() {
				continue
			}
			if pass(ctx, d, t) {
				cleared = true
			}
			if ctx.Err() != nil {
				return
			}
		}
		if cleared && d.Reclaim != nil {
			freed, err := d.Reclaim(ctx)
			if err != nil && ctx.Err() == nil {
				d.Log.Warn().Err(err).Msg("Handing the journal's freed space back failed; it is reused as it is")
			} else if freed > 0 {
				d.Log.Info().Int64("bytes", freed).Msg("The journal file shrank")
			}
		}
		next := due[0]
		for _, t := range due[1:] {
			if t.Before(next) {
				next = t
			}
		}
		timer := time.NewTimer(max(next.Sub(d.Now()), 0))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// pass runs one target's pass and reports whether it cleared anything.
func pass(ctx context.Context, d Deps, t Target) bool {
	start := d.Now()
	n, err := t.Store.Retain(ctx, t.Policy)
	log := d.Log.With().Str("agent", t.Agent).Logger()
	if err != nil {
		if ctx.Err() == nil {
			log.Warn().Err(err).Msg("Retention pass failed; it runs again at its next interval")
		}
		return n.Rows() > 0
	}
	if d.OnPass != nil {
		d.OnPass(t.Agent, n)
	}
	log.Info().Dur("took", d.Now().Sub(start)).Int64("bodies", n.Bodies).Int64("payloads", n.Payloads).
		Int64("turns", n.Turns).Int64("rejected", n.Rejected).Int64("identities", n.Identities).
		Int64("deliveries", n.Deliveries).Int64("approvals", n.Approvals).Int64("edits", n.Edits).
		Int64("bytes", n.Bytes).Msg("Retention pass finished")
	return n.Rows() > 0
}
