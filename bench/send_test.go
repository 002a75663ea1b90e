package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const (
	sendRoom  = "!send:example.org"
	sendToken = "bench-send-token"
)

// BenchmarkSendIdempotent measures keyed sends into the outbox through the
// agent API over loopback HTTP, on an on-disk journal (synchronous=FULL,
// group commit): each request reads the key's delivery, checks the
// membership and enqueues, and each answer waits for its commit. Senders
// are goroutines that each post new keys in a loop; "replay" posts keys
// already taken, which read and compare and enqueue nothing.
//
// Metrics: sends/s; p50-ms and p99-ms per request.
func BenchmarkSendIdempotent(b *testing.B) {
	for _, senders := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("new/senders=%d", senders), func(b *testing.B) {
			env := openSendEnv(b)
			runSends(b, env, senders, "new")
		})
	}
	b.Run("replay/senders=16", func(b *testing.B) {
		env := openSendEnv(b)
		// Every key the measured round posts was taken once before.
		runSends(b, env, 16, "replay")
		b.ResetTimer()
		runSends(b, env, 16, "replay")
	})
}

type sendEnv struct {
	srv  *httptest.Server
	view journal.PrincipalStore
}

func openSendEnv(b *testing.B) *sendEnv {
	b.Helper()
	ctx := context.Background()
	s, err := store.Open(ctx, store.Options{StorageDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	v, err := s.Principal(ctx, "sender", "@sender:example.org")
	if err != nil {
		b.Fatal(err)
	}
	// The room is joined once something of it was admitted.
	if _, err := v.AdmitBatch(ctx, mx.Live(sendRoom, mx.Message("$hello", "@alice:example.org", 1, "hi")), ""); err != nil {
		b.Fatal(err)
	}
	h := api.New(api.Deps{Agents: map[string]api.Agent{"sender": {Store: v, Token: sendToken, Hints: s.Hints()}},
		Log: zerolog.Nop()})
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = 128
	return &sendEnv{srv: srv, view: v}
}

// runSends posts b.N keyed sends from senders goroutines; keys are
// prefix-i, so a second run with the same prefix replays the first.
func runSends(b *testing.B, env *sendEnv, senders int, prefix string) {
	b.Helper()
	url := env.srv.URL + "/v1/agents/sender/rooms/" + sendRoom + "/send"
	var next atomic.Int64
	lat := make([][]time.Duration, senders)
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for s := range senders {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, url,
					strings.NewReader(`{"body":"scheduled report number `+fmt.Sprint(i)+`"}`))
				req.Header.Set("Authorization", "Bearer "+sendToken)
				req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", prefix, i))
				t0 := time.Now()
				resp, err := env.srv.Client().Do(req)
				if err != nil {
					failed.Store(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Store(fmt.Errorf("send %d: status %d", i, resp.StatusCode))
					return
				}
				lat[s] = append(lat[s], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "sends/s")
	b.ReportMetric(ms(all[len(all)/2]), "p50-ms")
	b.ReportMetric(ms(all[len(all)*99/100]), "p99-ms")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
