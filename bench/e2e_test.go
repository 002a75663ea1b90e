package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/mindroomd/mindroomd/agent"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// BenchmarkEndToEnd measures, on a real Dendrite on loopback, the time from
// a person's send to the agent's answer arriving in the person's own sync,
// with the journal in between: admission, the turn, enqueue-and-settle, the
// claim and the send. Beside it, the floor: the same person and a bare
// client (no journal) that answers as soon as its sync delivers the
// message. Dendrite's own latency drifts within minutes, so each iteration
// is one pair, a journal round and a floor round back to back, and the
// ratio reported is the median of the pairs' p50 ratios.
//
// Metrics: e2e-p50-ms, e2e-p99-ms, floor-p50-ms, floor-p99-ms over every
// message of the run; e2e/floor, the median per-pair ratio of p50s;
// p50-diff-ms, the e2e p50 less the floor's; p99/floor-p99.
func BenchmarkEndToEnd(b *testing.B) {
	perRound, warmup := 70, 5
	if testing.Short() {
		perRound, warmup = 5, 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hs := dendrite.Start(b)
	alice := hs.User(b, hs.Register(b, "alice", "alice-password"))
	botAcct := hs.Register(b, "bot", "bot-password")
	bareAcct := hs.Register(b, "bare", "bare-password")
	journaled := alice.CreateRoom(botAcct.UserID)
	floorRoom := alice.CreateRoom(bareAcct.UserID)

	// The journaled agent.
	dir := b.TempDir()
	s, err := store.Open(ctx, store.Options{StorageDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	view, err := s.Principal(ctx, "echo", botAcct.UserID)
	if err != nil {
		b.Fatal(err)
	}
	bot, err := matrix.Login(ctx, matrix.Config{Homeserver: hs.URL, UserID: botAcct.UserID, Password: botAcct.Password,
		Agent: "echo", StorageDir: dir, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	system := actors.NewSystem(zerolog.Nop())
	pid := system.Root.Spawn(principal.Props(principal.Deps{
		Store: view, Transport: bot, Agent: agent.AgentFunc(echoAnswer),
		Sender: matrix.NewSender(bot), Reconciler: matrix.NewReconciler(bot), DeviceID: bot.DeviceID(),
		Hints: s.Hints(), AutoJoin: true, Log: zerolog.Nop(),
	}))
	defer func() { _ = system.Root.StopFuture(pid).Wait() }()

	// The floor's bare client.
	bare, err := matrix.Login(ctx, matrix.Config{Homeserver: hs.URL, UserID: bareAcct.UserID, Password: bareAcct.Password,
		Agent: "bare", StorageDir: b.TempDir(), Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := bare.Join(ctx, floorRoom); err != nil {
		b.Fatal(err)
	}
	bareErr := make(chan error, 1)
	go func() { bareErr <- bareEcho(ctx, bare, floorRoom, alice) }()

	var seq atomic.Int64
	round := func(room string, n int) []time.Duration {
		out := make([]time.Duration, 0, n)
		for range n {
			text := "ping " + strconv.FormatInt(seq.Add(1), 10)
			start := time.Now()
			alice.SendText(room, text)
			wait, cancel := context.WithTimeout(ctx, time.Minute)
			alice.AwaitEvent(wait, room, func(raw json.RawMessage) bool { return bodyOf(raw) == "echo: "+text })
			cancel()
			out = append(out, time.Since(start))
		}
		return out
	}
	round(journaled, warmup) // the agent's join, first sync and prepared statements
	round(floorRoom, warmup)

	var e2eAll, floorAll []time.Duration
	var ratios []float64
	b.ResetTimer()
	for range b.N {
		e2e := round(journaled, perRound)
		floor := round(floorRoom, perRound)
		e2eAll, floorAll = append(e2eAll, e2e...), append(floorAll, floor...)
		ratios = append(ratios, float64(quantile(e2e, 0.5))/float64(quantile(floor, 0.5)))
	}
	b.StopTimer()
	select {
	case err := <-bareErr:
		b.Fatalf("the bare client stopped: %v", err)
	default:
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(quantile(e2eAll, 0.5)), "e2e-p50-ms")
	b.ReportMetric(ms(quantile(e2eAll, 0.99)), "e2e-p99-ms")
	b.ReportMetric(ms(quantile(floorAll, 0.5)), "floor-p50-ms")
	b.ReportMetric(ms(quantile(floorAll, 0.99)), "floor-p99-ms")
	b.ReportMetric(median(ratios), "e2e/floor")
	b.ReportMetric(ms(quantile(e2eAll, 0.5)-quantile(floorAll, 0.5)), "p50-diff-ms")
	b.ReportMetric(float64(quantile(e2eAll, 0.99))/float64(quantile(floorAll, 0.99)), "p99/floor-p99")
	b.ReportMetric(float64(len(e2eAll)), "messages")
}

// echoAnswer answers a text message with "echo: <body>" at once.
func echoAnswer(_ context.Context, turn agent.Turn) (agent.Reply, error) {
	if turn.Event.Kind != journal.KindMessage {
		return agent.Reply{Ignore: true}, nil
	}
	content, err := json.Marshal(map[string]string{"msgtype": "m.text", "body": "echo: " + bodyOf(turn.Event.Event)})
	return agent.Reply{Content: content}, err
}

// bareEcho is the floor's agent: a sync loop that answers each of the
// person's messages in room as soon as it arrives, and stores nothing.
func bareEcho(ctx context.Context, c *matrix.Client, room string, person *dendrite.User) error {
	since := ""
	txn := 0
	for ctx.Err() == nil {
		batch, err := c.Sync(ctx, since, 30*time.Second)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if since != "" {
			for _, r := range batch.Joined {
				if r.RoomID != room {
					continue
				}
				for _, raw := range r.Events {
					if senderOf(raw) != person.UserID || bodyOf(raw) == "" {
						continue
					}
					txn++
					content, _ := json.Marshal(map[string]string{"msgtype": "m.text", "body": "echo: " + bodyOf(raw)})
					if _, err := c.Send(ctx, room, "m.room.message", fmt.Sprintf("bare-%d", txn), content); err != nil {
						return err
					}
				}
			}
		}
		since = batch.NextBatch
	}
	return nil
}

func bodyOf(raw json.RawMessage) string {
	var ev struct {
		Content struct {
			Body string `json:"body"`
		} `json:"content"`
	}
	_ = json.Unmarshal(raw, &ev)
	return ev.Content.Body
}

func senderOf(raw json.RawMessage) string {
	var ev struct {
		Sender string `json:"sender"`
	}
	_ = json.Unmarshal(raw, &ev)
	return ev.Sender
}

// quantile is the q-quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
