package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// Retention's steady state: one agent admits messages in 8 rooms, one every
// 10 s of simulated time (2 min under -short, so its smaller run passes
// the windows too), settles each batch and answers one
// message in ten (a reply enqueued, sent and acknowledged). With retention
// on, a pass runs every simulated hour, as the daemon's does, under
// retentionBenchPolicy, and the file's free pages are handed back when
// they pass a quarter of it; off, nothing is pruned.
const (
	retentionRooms  = 8
	retentionBatch  = 360 // a batch of messages, and a pass after each
	retentionAnswer = 10  // one message in ten is answered
)

var retentionBenchPolicy = journal.RetentionPolicy{Bodies: 24 * time.Hour, Payloads: 24 * time.Hour,
	Turns: 24 * time.Hour, Rejected: 24 * time.Hour, Identities: 48 * time.Hour}

// BenchmarkRetentionSteadyState measures the journal file's bytes per
// message at two points of one long admission run, with retention on and
// off. Metrics: B/msg@<n> (the database file after a checkpoint, divided
// by the messages so far) at both points, and growth, the file's size at
// the second point over its size at the first: flat is 1, linear the
// ratio of the points (10). Full size 10^5 and 10^6 messages (about 115
// simulated days); -short 2·10^3 and 10^4 (about 14).
func BenchmarkRetentionSteadyState(b *testing.B) {
	points, step := []int{100_000, 1_000_000}, 10*time.Second
	if testing.Short() {
		points, step = []int{2_000, 10_000}, 2*time.Minute
	}
	for _, on := range []bool{true, false} {
		b.Run(map[bool]string{true: "on", false: "off"}[on], func(b *testing.B) {
			var sizes []int64
			for i := 0; i < b.N; i++ {
				sizes = retentionRun(b, on, points, step)
			}
			for i, n := range points {
				b.ReportMetric(float64(sizes[i])/float64(n), fmt.Sprintf("B/msg@%d", n))
			}
			b.ReportMetric(float64(sizes[len(sizes)-1])/float64(sizes[0]), "growth")
		})
	}
}

// retentionRun admits up to the last of points and returns the database
// file's size at each.
func retentionRun(b *testing.B, on bool, points []int, step time.Duration) []int64 {
	b.Helper()
	ctx := context.Background()
	clock := &testsupport.ShiftClock{Base: testsupport.DefaultNow}
	s, err := store.Open(ctx, store.Options{StorageDir: b.TempDir(), Now: clock.Now})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	v, err := s.Principal(ctx, agentName(0), agentUser(0))
	if err != nil {
		b.Fatal(err)
	}
	var (
		sizes []int64
		in    = make([]journal.Inbound, 0, retentionBatch)
		ids   = make([]string, 0, retentionBatch)
		n     int
	)
	for _, point := range points {
		for n < point {
			in, ids = in[:0], ids[:0]
			for range retentionBatch {
				id := fmt.Sprintf("$m%d", n)
				body := fmt.Sprintf("message %d of a long conversation, about as long as a person's line in a chat room", n)
				in = append(in, mx.Live(roomID(n%retentionRooms), mx.Message(id, agentUser(1), clock.Now().UnixMilli(), body))...)
				ids = append(ids, id)
				n++
				clock.Advance(step)
			}
			if _, err := v.AdmitBatch(ctx, in, fmt.Sprintf("s%d", n)); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < len(ids); i += retentionAnswer {
				room := in[i].RoomID
				req := journal.FinalReply(room, ids[i], nil, []byte(`{"msgtype":"m.text","body":"an answer of a sentence or two"}`), true)
				if _, err := v.EnqueueAndSettle(ctx, req); err != nil {
					b.Fatal(err)
				}
				if _, err := v.Claim(ctx, req.DeliveryID, journal.StageFinal, "DEVICE"); err != nil {
					b.Fatal(err)
				}
				if _, err := v.Acknowledge(ctx, req.DeliveryID, journal.StageFinal, journal.Sent{EventID: "$a" + ids[i][1:]}); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := v.Settle(ctx, ids...); err != nil {
				b.Fatal(err)
			}
			if on {
				if _, err := v.Retain(ctx, retentionBenchPolicy); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Reclaim(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		if _, err := s.DB().Checkpoint(ctx); err != nil {
			b.Fatal(err)
		}
		sz, err := s.DB().Sizes()
		if err != nil {
			b.Fatal(err)
		}
		sizes = append(sizes, sz.Database)
	}
	return sizes
}
