package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/hydrator"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

const (
	// hydratePage is the most messages the strict read asks for once the
	// walk is done.
	hydratePage = 50
)

// relationsPage is the events the bare loop asks for per /relations page:
// the hydrator's own.
const relationsPage = hydrator.DefaultRelationsPageSize

// BenchmarkHydrateThread measures the hydration of a cold thread on a real
// Dendrite on loopback against a floor. A person posts a thread (1,000
// replies, 200 of them edited; 50 and 10 under -short) while the agent,
// already in the room, is not running. The hydrator's side opens a fresh
// journal and makes one strict read of the thread through the
// hydrator.Reader, which walks to the window (the default, 200 replies; 20
// under -short, so the smoke run stops at the window too) and installs what
// it fetched. The floor is a bare loop over the same client making the same
// requests (the root, the root's relations, each reply's relations, the
// root's edits) and keeping nothing. Dendrite's speed drifts, so each
// iteration is one pair, the two sides back to back in alternating order,
// and the ratio is the median of the pairs' ratios.
//
// Metrics: hydrator-ms and bare-ms, the mean wall time of one walk;
// hydrator-reqs and bare-reqs, the requests of one walk; events, the raw
// events one walk fetched; ratio, the median per-pair hydrator/bare.
func BenchmarkHydrateThread(b *testing.B) {
	replies, edits, window := 1000, 200, hydrator.DefaultWindow
	if testing.Short() {
		replies, edits, window = 50, 10, 20
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hs := dendrite.Start(b)
	alice := hs.User(b, hs.Register(b, "alice", "alice-password"))
	botAcct := hs.Register(b, "bot", "bot-password")
	room := alice.CreateRoom(botAcct.UserID)
	client, err := matrix.Login(ctx, matrix.Config{Homeserver: hs.URL, UserID: botAcct.UserID, Password: botAcct.Password,
		Agent: "hydrate", StorageDir: b.TempDir(), Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := client.Join(ctx, room); err != nil {
		b.Fatal(err)
	}
	shown := min(hydratePage, window)
	th := postThread(b, alice, room, replies, edits, shown)
	settle, cancelSettle := context.WithTimeout(ctx, 2*time.Minute)
	alice.AwaitEvent(settle, room, dendrite.WithID(th.last))
	cancelSettle()

	tr := &countedTransport{Client: client}
	system := actors.NewSystem(zerolog.Nop())
	hydrate := func() (time.Duration, hydrator.Walk, int64) {
		b.StopTimer()
		dir := b.TempDir()
		s, err := store.Open(ctx, store.Options{StorageDir: dir})
		if err != nil {
			b.Fatal(err)
		}
		view, err := s.Principal(ctx, "hydrate", botAcct.UserID)
		if err != nil {
			b.Fatal(err)
		}
		walks := make(chan hydrator.Walk, 1)
		pid := system.Root.Spawn(hydrator.Props(hydrator.Deps{Store: view, Transport: tr, Window: window,
			Log: zerolog.Nop(), Finished: func(w hydrator.Walk, _ error) { walks <- w }}))
		reader := &hydrator.Reader{Store: view, Root: system.Root, Hydrator: pid, Log: zerolog.Nop()}
		before := tr.n.Load()
		b.StartTimer()
		start := time.Now()
		page, err := reader.Read(ctx, journal.ReadRequest{RoomID: room, Thread: &th.root, Limit: shown, Strict: true})
		took := time.Since(start)
		b.StopTimer()
		if err != nil {
			b.Fatalf("strict read: %v", err)
		}
		requests := tr.n.Load() - before
		if got := threadBodies(page); !slices.Equal(got, th.newest) {
			b.Fatalf("the strict read after hydration shows %q, want %q", got, th.newest)
		}
		w := <-walks
		_ = system.Root.StopFuture(pid).Wait()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		return took, w, requests
	}
	bare := func() (time.Duration, int, int64) {
		before := tr.n.Load()
		start := time.Now()
		events, err := bareThreadWalk(ctx, tr, room, th.root, window)
		took := time.Since(start)
		if err != nil {
			b.Fatalf("bare walk: %v", err)
		}
		return took, events, tr.n.Load() - before
	}
	pair := func(i int) (h, f time.Duration, hw hydrator.Walk, hReqs, fReqs int64) {
		var fEvents int
		if i%2 == 0 {
			h, hw, hReqs = hydrate()
			f, fEvents, fReqs = bare()
		} else {
			f, fEvents, fReqs = bare()
			h, hw, hReqs = hydrate()
		}
		switch {
		case hReqs > fReqs:
			b.Fatalf("the hydrator made %d requests, the bare loop %d", hReqs, fReqs)
		case int64(hw.Requests) != hReqs:
			b.Fatalf("the walk counts %d requests, the transport saw %d", hw.Requests, hReqs)
		case hw.Events != fEvents || hw.Installed != hw.Events:
			b.Fatalf("the walk fetched %d events and installed %d, the bare loop fetched %d", hw.Events, hw.Installed, fEvents)
		case hw.Messages != min(window, replies):
			b.Fatalf("the walk counted %d messages, want %d", hw.Messages, min(window, replies))
		}
		return h, f, hw, hReqs, fReqs
	}
	// Unmeasured: Dendrite's caches, the client's connections.
	pair(0)

	var hTotal, fTotal time.Duration
	var hReqs, fReqs int64
	var events int
	var ratios []float64
	i := 0
	for b.Loop() {
		h, f, w, hr, fr := pair(i)
		i++
		hTotal, fTotal = hTotal+h, fTotal+f
		hReqs, fReqs, events = hReqs+hr, fReqs+fr, w.Events
		ratios = append(ratios, float64(h)/float64(f))
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(i) }
	b.ReportMetric(ms(hTotal), "hydrator-ms")
	b.ReportMetric(ms(fTotal), "bare-ms")
	b.ReportMetric(float64(hReqs)/float64(i), "hydrator-reqs")
	b.ReportMetric(float64(fReqs)/float64(i), "bare-reqs")
	b.ReportMetric(float64(events), "events")
	b.ReportMetric(median(ratios), "ratio")
}

// postedThread is a thread as its author posted it.
type postedThread struct {
	root, last string
	// newest is the bodies of the newest replies a page of shown holds,
	// oldest first, as a reader must see them: edited where they were
	// edited.
	newest []string
}

// postThread posts a root and replies thread replies into room, with edits
// of replies spread evenly over the thread, each right after its reply.
func postThread(b *testing.B, person *dendrite.User, room string, replies, edits, shown int) postedThread {
	b.Helper()
	th := postedThread{root: person.SendText(room, "root")}
	every := replies / edits
	for i := range replies {
		body := fmt.Sprintf("reply %d", i)
		th.last = person.ThreadReply(room, th.root, body)
		if i%every == every-1 {
			body = fmt.Sprintf("reply %d, edited", i)
			th.last = person.Edit(room, th.last, body)
		}
		if i >= replies-shown {
			th.newest = append(th.newest, body)
		}
	}
	return th
}

func threadBodies(p journal.Page) []string {
	out := make([]string, 0, len(p.Messages))
	for _, m := range p.Messages {
		var c struct {
			Body string `json:"body"`
		}
		_ = json.Unmarshal(m.Content, &c)
		out = append(out, c.Body)
	}
	return out
}

// countedTransport counts the requests made of the homeserver, by the
// hydrator and by the bare loop alike.
type countedTransport struct {
	*matrix.Client
	n atomic.Int64
}

func (c *countedTransport) Messages(ctx context.Context, room, from string, dir matrix.Direction, limit int) (matrix.MessagesPage, error) {
	c.n.Add(1)
	return c.Client.Messages(ctx, room, from, dir, limit)
}

func (c *countedTransport) Relations(ctx context.Context, room, id, relType, from string, limit int) (matrix.RelationsPage, error) {
	c.n.Add(1)
	return c.Client.Relations(ctx, room, id, relType, from, limit)
}

func (c *countedTransport) Event(ctx context.Context, room, id string) (json.RawMessage, error) {
	c.n.Add(1)
	return c.Client.Event(ctx, room, id)
}

// bareThreadWalk is the floor of a thread's walk: the requests a client
// needs to hold the newest window replies with their edits from a server
// that does not recurse, and nothing else. It fetches the root, the
// thread's replies newest first, all of each reply's own relations, and
// the root's edits. It keeps nothing and returns the events fetched.
func bareThreadWalk(ctx context.Context, c *countedTransport, room, root string, window int) (int, error) {
	if _, err := c.Event(ctx, room, root); err != nil {
		return 0, err
	}
	events, replies, from := 1, 0, ""
	for {
		page, err := c.Relations(ctx, room, root, "m.thread", from, relationsPage)
		if err != nil {
			return events, err
		}
		for _, raw := range page.Chunk {
			events++
			var ev struct {
				ID      string `json:"event_id"`
				Type    string `json:"type"`
				Content struct {
					RelatesTo struct {
						RelType string `json:"rel_type"`
						EventID string `json:"event_id"`
					} `json:"m.relates_to"`
				} `json:"content"`
			}
			if json.Unmarshal(raw, &ev) != nil || ev.Type != "m.room.message" ||
				ev.Content.RelatesTo.RelType != "m.thread" || ev.Content.RelatesTo.EventID != root {
				continue
			}
			n, err := bareRelations(ctx, c, room, ev.ID, "")
			if err != nil {
				return events, err
			}
			events += n
			if replies++; replies == window {
				break
			}
		}
		if replies == window || page.NextBatch == "" || len(page.Chunk) == 0 {
			n, err := bareRelations(ctx, c, room, root, "m.replace")
			return events + n, err
		}
		from = page.NextBatch
	}
}

// bareRelations fetches every relation of id of relType ("" for all) and
// returns how many there were.
func bareRelations(ctx context.Context, c *countedTransport, room, id, relType string) (int, error) {
	n, from := 0, ""
	for {
		page, err := c.Relations(ctx, room, id, relType, from, relationsPage)
		if err != nil {
			return n, err
		}
		n += len(page.Chunk)
		if page.NextBatch == "" || len(page.Chunk) == 0 {
			return n, nil
		}
		from = page.NextBatch
	}
}
