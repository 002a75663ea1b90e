package hydrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/hydrator"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// hs is the package's homeserver; each test registers its own users.
var hs *dendrite.Server

func TestMain(m *testing.M) { os.Exit(dendrite.RunTests(m, func(s *dendrite.Server) { hs = s })) }

const testDeadline = 90 * time.Second

var accounts atomic.Int64

// counting counts the requests a walk makes of the homeserver.
type counting struct {
	*matrix.Client
	n atomic.Int64
}

func (c *counting) Messages(ctx context.Context, room, from string, dir matrix.Direction, limit int) (matrix.MessagesPage, error) {
	c.n.Add(1)
	return c.Client.Messages(ctx, room, from, dir, limit)
}

func (c *counting) Relations(ctx context.Context, room, id, relType, from string, limit int) (matrix.RelationsPage, error) {
	c.n.Add(1)
	return c.Client.Relations(ctx, room, id, relType, from, limit)
}

func (c *counting) Event(ctx context.Context, room, id string) (json.RawMessage, error) {
	c.n.Add(1)
	return c.Client.Event(ctx, room, id)
}

// fixture is an agent that joined alice's room and whose journal knows
// nothing of it yet: everything in the room happened while the agent was
// not running.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	alice  *dendrite.User
	bot    dendrite.Account
	room   string
	store  *store.Store
	view   journal.PrincipalStore
	client *matrix.Client
	tr     *counting
	system *actor.ActorSystem
	pid    *actor.PID
	reader *hydrator.Reader

	mu    sync.Mutex
	walks []hydrator.Walk
}

func newFixture(t *testing.T, deps hydrator.Deps) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*testDeadline)
	t.Cleanup(cancel)
	n := accounts.Add(1)
	f := &fixture{t: t, ctx: ctx, system: actors.NewSystem(zerolog.Nop())}
	f.bot = hs.Register(t, fmt.Sprintf("hbot%d", n), "bot-password")
	f.alice = hs.User(t, hs.Register(t, fmt.Sprintf("halice%d", n), "alice-password"))
	f.room = f.alice.CreateRoom(f.bot.UserID)
	storage := t.TempDir()
	var err error
	if f.store, err = store.Open(ctx, store.Options{StorageDir: storage}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.store.Close() })
	if f.view, err = f.store.Principal(ctx, "helper", f.bot.UserID); err != nil {
		t.Fatal(err)
	}
	if f.client, err = matrix.Login(ctx, matrix.Config{Homeserver: hs.URL, UserID: f.bot.UserID, Password: f.bot.Password,
		Agent: "helper", StorageDir: storage, Log: zerolog.Nop()}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.Join(ctx, f.room); err != nil {
		t.Fatal(err)
	}
	f.tr = &counting{Client: f.client}
	deps.Store, deps.Transport = f.view, f.tr
	deps.Finished = func(w hydrator.Walk, _ error) {
		f.mu.Lock()
		f.walks = append(f.walks, w)
		f.mu.Unlock()
	}
	f.pid = f.system.Root.Spawn(hydrator.Props(deps))
	t.Cleanup(func() { _ = f.system.Root.StopFuture(f.pid).Wait() })
	f.reader = &hydrator.Reader{Store: f.view, Root: f.system.Root, Hydrator: f.pid}
	return f
}

// settled waits until alice's own sync shows eventID: Dendrite fills the
// store /messages and /relations read in order, after the sync's.
func (f *fixture) settled(eventID string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	f.alice.AwaitEvent(ctx, f.room, dendrite.WithID(eventID))
}

// related waits until the server lists child among target's relations,
// asking through the client directly so the walk's count stays its own.
func (f *fixture) related(target, child string) {
	f.t.Helper()
	f.settled(child)
	deadline := time.Now().Add(testDeadline)
	for {
		page, err := f.client.Relations(f.ctx, f.room, target, "m.replace", "", hydrator.DefaultRelationsPageSize)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, raw := range page.Chunk {
			var ev struct {
				EventID string `json:"event_id"`
			}
			if json.Unmarshal(raw, &ev) == nil && ev.EventID == child {
				return
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the server never listed %s among the relations of %s", child, target)
		}
		time.Sleep(20 * time.Millisecond) // Dendrite offers no signal for its relations index
	}
}

func (f *fixture) read(req journal.ReadRequest) journal.Page {
	f.t.Helper()
	page, err := f.reader.Read(f.ctx, req)
	if err != nil {
		f.t.Fatalf("Read: %v", err)
	}
	return page
}

// bodies renders a page as its bodies, oldest first.
func bodies(p journal.Page) []string {
	out := []string{}
	for _, m := range p.Messages {
		var c struct {
			Body string `json:"body"`
		}
		_ = json.Unmarshal(m.Content, &c)
		out = append(out, c.Body)
	}
	return out
}

func (f *fixture) finished() []hydrator.Walk {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.walks)
}

func (f *fixture) pending() int {
	f.t.Helper()
	page, err := f.view.Pending(f.ctx, 1000, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	return len(page.Events) + len(page.Unreadable)
}

func TestAColdThreadIsReadWithItsEditsAndConcurrentReadersShareOneWalk(t *testing.T) {
	f := newFixture(t, hydrator.Deps{})
	root := f.alice.SendText(f.room, "root")
	// More replies than one /relations page of Dendrite's holds.
	const replies = 45
	var want []string
	for i := range replies {
		reply := f.alice.ThreadReply(f.room, root, fmt.Sprintf("reply %d", i))
		body := fmt.Sprintf("reply %d", i)
		switch i {
		case 3:
			f.alice.Edit(f.room, reply, "reply 3, once")
			f.alice.Edit(f.room, reply, "reply 3, twice")
			body = "reply 3, twice"
		case 7:
			f.alice.Edit(f.room, reply, "reply 7, edited")
			body = "reply 7, edited"
		}
		want = append(want, body)
	}
	// The root's edit is the last event: once it is settled, and shown by
	// the root's relations (Dendrite indexes relations after the sync
	// shows an event), so is the thread.
	last := f.alice.Edit(f.room, root, "root, edited")
	f.related(root, last)
	want = append([]string{"root, edited"}, want...)

	const readers = 4
	pages := make([]journal.Page, readers)
	errs := make([]error, readers)
	var wg sync.WaitGroup
	for i := range readers {
		wg.Go(func() {
			pages[i], errs[i] = f.reader.Read(f.ctx, journal.ReadRequest{RoomID: f.room, Thread: &root, Limit: 50, Strict: true})
		})
	}
	wg.Wait()
	for i := range readers {
		if errs[i] != nil {
			t.Fatalf("reader %d: %v", i, errs[i])
		}
		if got := bodies(pages[i]); !slices.Equal(got, want) {
			t.Fatalf("reader %d sees %q, want %q", i, got, want)
		}
	}
	var walked []hydrator.Walk
	for _, w := range f.finished() {
		if !w.Covered {
			walked = append(walked, w)
		}
	}
	if len(walked) != 1 {
		t.Fatalf("%d walks fetched from the server, want one shared walk: %+v", len(walked), walked)
	}
	if got := f.tr.n.Load(); got != int64(walked[0].Requests) {
		t.Fatalf("%d requests made, the one walk counts %d", got, walked[0].Requests)
	}
	// The root, the pages of its replies, each reply's own relations
	// (Dendrite does not recurse), and the root's edits.
	replyPages := (replies + hydrator.DefaultRelationsPageSize - 1) / hydrator.DefaultRelationsPageSize
	if got, want := walked[0].Requests, 1+replyPages+replies+1; got != want {
		t.Errorf("the walk made %d requests, want %d", got, want)
	}
	if n := f.pending(); n != 0 {
		t.Errorf("%d hydrated events are pending, want none", n)
	}
	// A covered thread costs no request.
	before := f.tr.n.Load()
	f.read(journal.ReadRequest{RoomID: f.room, Thread: &root, Limit: 50, Strict: true})
	if got := f.tr.n.Load(); got != before {
		t.Errorf("a read of a covered thread made %d requests", got-before)
	}
}

func TestARefetchAfterTheVisibleEditIsRedactedInstallsTheServersRevision(t *testing.T) {
	f := newFixture(t, hydrator.Deps{})
	m := f.alice.SendText(f.room, "hi")
	f.alice.Edit(f.room, m, "one")
	e2 := f.alice.Edit(f.room, m, "two")
	f.settled(e2)
	if got := bodies(f.read(journal.ReadRequest{RoomID: f.room, Limit: 10})); !slices.Contains(got, "two") {
		t.Fatalf("after hydration the room shows %q, want the edit", got)
	}
	// The redaction of the revision on screen reaches the journal, as
	// sync delivers it.
	x := f.alice.Redact(f.room, e2)
	f.settled(x)
	raw, err := f.client.Event(f.ctx, f.room, x)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.view.AdmitBatch(f.ctx, []journal.Inbound{{RoomID: f.room, Provenance: journal.Live, Event: raw}}, ""); err != nil {
		t.Fatal(err)
	}
	page := f.read(journal.ReadRequest{RoomID: f.room, Limit: 10})
	if !slices.Equal(page.OwedRefetch, []string{m}) || slices.Contains(bodies(page), "two") {
		t.Fatalf("a read that is not strict = %q owing %v; want the redacted body gone and %s owed", bodies(page), page.OwedRefetch, m)
	}
	before := f.tr.n.Load()
	page = f.read(journal.ReadRequest{RoomID: f.room, Limit: 10, Strict: true})
	if got := bodies(page); !slices.Contains(got, "one") || len(page.OwedRefetch) != 0 {
		t.Fatalf("a strict read = %q owing %v; want the server's revision \"one\"", got, page.OwedRefetch)
	}
	// The original and one page of its edits.
	if got := f.tr.n.Load() - before; got != 2 {
		t.Errorf("the refetch made %d requests, want 2", got)
	}
	if n := f.pending(); n != 1 {
		// The live redaction is owed its turn; nothing hydrated is.
		t.Errorf("%d events pending, want only the live redaction", n)
	}
}

func TestAFailedRefetchFailsAStrictReadClosedAndKeepsTheDebt(t *testing.T) {
	f := newFixture(t, hydrator.Deps{})
	m := f.alice.SendText(f.room, "hi")
	e := f.alice.Edit(f.room, m, "one")
	f.settled(e)
	f.read(journal.ReadRequest{RoomID: f.room, Limit: 10})
	// The journal learns of a redaction the server never made: the server
	// still serves the edit, which the rules must refuse.
	redaction := fmt.Sprintf(`{"event_id":"$local-redaction","type":"m.room.redaction","sender":%q,"origin_server_ts":%d,"redacts":%q,"content":{}}`,
		f.alice.UserID, time.Now().UnixMilli(), e)
	if _, err := f.view.AdmitBatch(f.ctx, []journal.Inbound{{RoomID: f.room, Provenance: journal.Live, Event: json.RawMessage(redaction)}}, ""); err != nil {
		t.Fatal(err)
	}
	_, err := f.reader.Read(f.ctx, journal.ReadRequest{RoomID: f.room, Limit: 10, Strict: true})
	if !errors.Is(err, journal.ErrStrictRead) || !errors.Is(err, journal.ErrRefetchRefused) {
		t.Fatalf("strict read: %v, want it to fail closed with the refusal", err)
	}
	if _, owed, err := f.view.RefreshDebt(f.ctx, f.room, m); err != nil || !owed {
		t.Fatalf("the debt is gone after a failed refetch (%v, %v)", owed, err)
	}
	page := f.read(journal.ReadRequest{RoomID: f.room, Limit: 10})
	if !slices.Equal(page.OwedRefetch, []string{m}) {
		t.Fatalf("a read that is not strict owes %v, want %s", page.OwedRefetch, m)
	}
}

func TestALargeRoomIsServedAfterAWalkBoundedByItsWindowAndCeiling(t *testing.T) {
	const (
		messages = 2000
		window   = 100
		ceiling  = 150
	)
	f := newFixture(t, hydrator.Deps{Window: window, Ceiling: ceiling})
	last := ""
	for i := range messages {
		last = f.alice.SendText(f.room, fmt.Sprintf("message %d", i))
		if i%10 == 9 {
			f.alice.Edit(f.room, last, fmt.Sprintf("message %d, edited", i))
		}
	}
	f.settled(last)
	page := f.read(journal.ReadRequest{RoomID: f.room, Limit: 50})
	var want []string
	for i := messages - 50; i < messages; i++ {
		if i%10 == 9 {
			want = append(want, fmt.Sprintf("message %d, edited", i))
		} else {
			want = append(want, fmt.Sprintf("message %d", i))
		}
	}
	if got := bodies(page); !slices.Equal(got, want) {
		t.Fatalf("the first page = %q, want %q", got, want)
	}
	walks := f.finished()
	if len(walks) != 1 {
		t.Fatalf("%d walks, want 1", len(walks))
	}
	w := walks[0]
	if w.Events > ceiling || w.Messages > window || w.Complete {
		t.Fatalf("walk %+v: fetched beyond its window %d or ceiling %d", w, window, ceiling)
	}
	if maxRequests := (ceiling+hydrator.DefaultPageSize-1)/hydrator.DefaultPageSize + 1; w.Requests > maxRequests {
		t.Fatalf("walk made %d requests, at most %d fit its ceiling", w.Requests, maxRequests)
	}
	if n := f.pending(); n != 0 {
		t.Fatalf("%d hydrated events are pending, want none", n)
	}
}
