package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
)

// outboxMemPrincipals share the run's replies, each with its own outbox
// actor, so their commits share group commits.
const outboxMemPrincipals = 16

// instantSender accepts every send at once with a new event ID: fault-free
// load, no homeserver.
type instantSender struct{ n atomic.Int64 }

func (s *instantSender) Send(context.Context, journal.Delivery, json.RawMessage) (journal.Sent, error) {
	n := s.n.Add(1)
	return journal.Sent{EventID: fmt.Sprintf("$sent-%d:bench.example.org", n), ServerTS: 1_700_000_000_000 + n}, nil
}

// flagMemory opts into BenchmarkOutboxMemory at its full size, which takes
// minutes a round: `make bench` leaves it to its -short size unless asked.
var flagMemory = flag.Bool("memory", false, "run BenchmarkOutboxMemory at 10⁵ replies")

// BenchmarkOutboxMemory sends 10⁵ replies (10³ under -short, or without
// -memory, which `make bench-memory` gives) through the
// outbox actors of 16 principals over a journal on disk, every send
// accepted at once, and measures the Go heap in use once all are
// acknowledged, against the heap after start-up. A long-running daemon
// sends without end: what an actor keeps per finished reply grows the
// heap by that much per reply.
//
// Metrics: heap-inuse-B after the replies (after a GC); heap-growth-B, that
// less the heap in use before them; B/reply, the growth per reply.
func BenchmarkOutboxMemory(b *testing.B) {
	replies := 100_000
	if testing.Short() || !*flagMemory {
		replies = 1000
	}
	perPrincipal := replies / outboxMemPrincipals
	for range b.N {
		b.StopTimer()
		ctx, cancel := context.WithCancel(context.Background())
		s, err := store.Open(ctx, store.Options{StorageDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		system := actors.NewSystem(zerolog.Nop())
		var acked atomic.Int64
		done := make(chan struct{})
		views := make([]journal.PrincipalStore, outboxMemPrincipals)
		var pids []func()
		for p := range views {
			v, err := s.Principal(ctx, fmt.Sprintf("agent%02d", p), fmt.Sprintf("@bot%02d:bench.example.org", p))
			if err != nil {
				b.Fatal(err)
			}
			views[p] = v
			sub := s.Hints().Subscribe(v.Principal().String())
			pid := system.Root.Spawn(outbox.Props(outbox.Deps{
				Outbox: v, Sender: &instantSender{}, DeviceID: "BENCH", Hints: sub, Log: zerolog.Nop(),
				Observe: func(pt outbox.Point, _ journal.Delivery) {
					if pt == outbox.Acknowledged && acked.Add(1) == int64(perPrincipal*outboxMemPrincipals) {
						close(done)
					}
				},
			}))
			pids = append(pids, func() { _ = system.Root.StopFuture(pid).Wait(); sub.Close() })
		}
		before := heapInUse()
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, outboxMemPrincipals)
		for p, v := range views {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perPrincipal {
					_, err := v.EnqueueAndSettle(ctx, journal.EnqueueRequest{
						DeliveryID: fmt.Sprintf("reply-%02d-%06d", p, i), Stage: journal.StageFinal,
						RoomID:  "!room:bench.example.org",
						Content: json.RawMessage(`{"msgtype":"m.text","body":"an answer"}`),
					})
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(30 * time.Minute):
			b.Fatalf("%d of %d replies acknowledged", acked.Load(), perPrincipal*outboxMemPrincipals)
		}
		b.StopTimer()
		took := time.Since(start)
		after := heapInUse()
		sent := float64(perPrincipal * outboxMemPrincipals)
		b.ReportMetric(float64(after), "heap-inuse-B")
		b.ReportMetric(float64(after)-float64(before), "heap-growth-B")
		b.ReportMetric((float64(after)-float64(before))/sent, "B/reply")
		b.ReportMetric(sent/took.Seconds(), "replies/s")
		for _, stop := range pids {
			stop()
		}
		cancel()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// heapInUse is the Go heap in use after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
