package principal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// upload is one call of fakeTransport.Upload.
type upload struct {
	contentType, filename string
	body                  []byte
	size                  int64
}

// typingCall is one call of fakeTransport.Typing.
type typingCall struct {
	typing  bool
	timeout time.Duration
}

// fakeTransport is a homeserver that takes uploads and typing notices;
// anything else it is asked panics on the nil Transport.
type fakeTransport struct {
	Transport
	mu        sync.Mutex
	uploads   []upload
	uploadErr error
	// onTyping, when set, hears of each typing notice.
	onTyping func(typingCall)
}

func (f *fakeTransport) UploadFor(_ context.Context, _, contentType, filename string, body io.Reader, size int64) (journal.Attachment, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return journal.Attachment{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uploads = append(f.uploads, upload{contentType, filename, b, size})
	if f.uploadErr != nil {
		return journal.Attachment{}, f.uploadErr
	}
	return journal.Attachment{URL: "mxc://example.org/uploaded", Name: filename, MimeType: contentType, Size: size}, nil
}

func (f *fakeTransport) Typing(_ context.Context, _ string, typing bool, timeout time.Duration) error {
	if f.onTyping != nil {
		f.onTyping(typingCall{typing, timeout})
	}
	return nil
}

func (f *fakeTransport) uploaded() []upload {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]upload(nil), f.uploads...)
}

// turnActor is a principal of view v answering with ag through tr, its
// turns run by hand (offer) rather than by the work loop.
func turnActor(v journal.PrincipalStore, ag agent.Agent, tr Transport, change func(*Deps)) *principalActor {
	d := Deps{Store: v, Agent: ag, Transport: tr, Now: time.Now, BackoffBase: time.Hour, BackoffMax: time.Hour}
	if change != nil {
		change(&d)
	}
	return &principalActor{deps: d, log: zerolog.Nop()}
}

// pendingA is the view's pending message $a.
func pendingA(t *testing.T, v journal.PrincipalStore) journal.PendingEvent {
	t.Helper()
	page, err := v.Pending(context.Background(), 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Events {
		if e.EventID == "$a" {
			return e
		}
	}
	t.Fatal("$a is not pending")
	return journal.PendingEvent{}
}

// settled reports whether $a is no longer pending.
func settled(t *testing.T, v journal.PrincipalStore) bool {
	t.Helper()
	page, err := v.Pending(context.Background(), 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Events {
		if e.EventID == "$a" {
			return false
		}
	}
	return true
}

// reactWith answers every turn with a reaction of key, counting the turns.
func reactWith(key string, asked *atomic.Int32) agent.Agent {
	return agent.AgentFunc(func(context.Context, agent.Turn) (agent.Reply, error) {
		asked.Add(1)
		return agent.Reply{React: key}, nil
	})
}

// failingReactions fails the first enqueue of a reaction, as a busy
// database does, after the turn's record committed.
type failingReactions struct {
	journal.PrincipalStore
	failed atomic.Bool
}

func (s *failingReactions) EnqueueAndSettle(ctx context.Context, req journal.EnqueueRequest) (journal.EnqueueResult, error) {
	if req.EventType == journal.TypeReaction && s.failed.CompareAndSwap(false, true) {
		return journal.EnqueueResult{}, errors.New("database is locked")
	}
	return s.PrincipalStore.EnqueueAndSettle(ctx, req)
}

// checkReaction fails unless the journal holds exactly the reaction with
// key to $a as the turn's answer, and no message.
func checkReaction(t *testing.T, v journal.PrincipalStore, room, key string) {
	t.Helper()
	ctx := context.Background()
	d, err := v.Delivery(ctx, journal.ReactionDeliveryID("$a", key, 0), journal.StageFinal)
	if err != nil {
		t.Fatalf("the reaction was not enqueued: %v", err)
	}
	if d.EventType != journal.TypeReaction || !bytes.Equal(d.Content, journal.ReactionContent("$a", key)) ||
		d.TurnID != journal.ReplyDeliveryID("$a") || d.RoomID != room {
		t.Fatalf("the reaction's delivery = %+v (content %s), want an m.reaction with %s to $a completing its turn",
			d, d.Content, key)
	}
	if _, err := v.Delivery(ctx, journal.ReplyDeliveryID("$a"), journal.StageFinal); !errors.Is(err, journal.ErrNoDelivery) {
		t.Fatalf("a message answers the reaction's turn too (%v)", err)
	}
	rec, ok, err := v.TurnForEvent(ctx, "$a")
	if err != nil || !ok || rec.State != journal.TurnResultRecorded {
		t.Fatalf("turn record = %+v, %v, %v; want the reaction recorded", rec, ok, err)
	}
	if got, ok := journal.RecordedReaction(rec.Record, "$a"); !ok || got != key {
		t.Fatalf("the turn records %s, want the reaction %s", rec.Record, key)
	}
	if !settled(t, v) {
		t.Fatal("$a is still pending after its reaction was enqueued")
	}
}

func TestAReactionReplyIsRecordedAndEnqueuedAsAReactionThatSettlesTheEvent(t *testing.T) {
	v, room := viewWithMessage(t)
	var asked atomic.Int32
	a := turnActor(v, reactWith("👍", &asked), &fakeTransport{}, nil)
	if err := a.offer(context.Background(), pendingA(t, v)); err != nil {
		t.Fatal(err)
	}
	checkReaction(t, v, room, "👍")
}

// The turn's record commits before the reaction's enqueue: an enqueue
// that fails (or a crash) leaves the reaction recorded, and the retry sends
// it as the reaction it is, without asking the agent again.
func TestARecordedReactionIsSentAgainAsAReactionWithoutAskingTheAgent(t *testing.T) {
	v, room := viewWithMessage(t)
	store := &failingReactions{PrincipalStore: v}
	var asked atomic.Int32
	a := turnActor(store, reactWith("🎉", &asked), &fakeTransport{}, nil)
	ctx := context.Background()
	if err := a.offer(ctx, pendingA(t, v)); err == nil || !strings.Contains(err.Error(), "database is locked") {
		t.Fatalf("first offer = %v, want the enqueue's failure", err)
	}
	if settled(t, v) {
		t.Fatal("$a settled though its reaction was never enqueued")
	}
	if err := a.offer(ctx, pendingA(t, v)); err != nil {
		t.Fatal(err)
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("the agent was asked %d times, want once: the reaction was recorded", n)
	}
	checkReaction(t, v, room, "🎉")
}

// answerWith answers every turn with reply.
func answerWith(reply agent.Reply) agent.Agent {
	return agent.AgentFunc(func(context.Context, agent.Turn) (agent.Reply, error) { return reply, nil })
}

// finalContent is the content of the final answer to $a the journal
// holds, and its turn record's.
func finalContent(t *testing.T, v journal.PrincipalStore) map[string]any {
	t.Helper()
	ctx := context.Background()
	d, err := v.Delivery(ctx, journal.ReplyDeliveryID("$a"), journal.StageFinal)
	if err != nil {
		t.Fatalf("no final answer: %v", err)
	}
	rec, ok, err := v.TurnForEvent(ctx, "$a")
	if err != nil || !ok || !bytes.Equal(rec.Record, d.Content) {
		t.Fatalf("turn record %s (%v, %v), want the answer %s", rec.Record, ok, err, d.Content)
	}
	var c map[string]any
	if err := json.Unmarshal(d.Content, &c); err != nil {
		t.Fatal(err)
	}
	if rel, _ := c["m.relates_to"].(map[string]any); rel == nil || rel["m.in_reply_to"] == nil {
		t.Fatalf("the answer %s is not a reply to $a", d.Content)
	}
	if !settled(t, v) {
		t.Fatal("$a is still pending after its answer was enqueued")
	}
	return c
}

// png is a file whose content says it is a PNG.
var png = append([]byte("\x89PNG\r\n\x1a\n"), "pixels"...)

func TestAnAttachmentIsUploadedOnceAndTheAnswerCarriesItsMXCURL(t *testing.T) {
	v, _ := viewWithMessage(t)
	path := filepath.Join(t.TempDir(), "chart.png")
	if err := os.WriteFile(path, png, 0o600); err != nil {
		t.Fatal(err)
	}
	tr := &fakeTransport{}
	a := turnActor(v, answerWith(agent.Reply{Attachment: &agent.File{Path: path, Caption: "the chart"}}), tr, nil)
	if err := a.offer(context.Background(), pendingA(t, v)); err != nil {
		t.Fatal(err)
	}
	ups := tr.uploaded()
	if len(ups) != 1 || ups[0].contentType != "image/png" || ups[0].filename != "chart.png" ||
		!bytes.Equal(ups[0].body, png) || ups[0].size != int64(len(png)) {
		t.Fatalf("uploads = %+v, want chart.png once, as image/png, sniffed", ups)
	}
	c := finalContent(t, v)
	info, _ := c["info"].(map[string]any)
	if c["msgtype"] != "m.image" || c["url"] != "mxc://example.org/uploaded" || c["body"] != "the chart" ||
		c["filename"] != "chart.png" || info["mimetype"] != "image/png" || info["size"] != float64(len(png)) {
		t.Fatalf("answer = %v, want an m.image of the uploaded file captioned \"the chart\"", c)
	}
}

// A file that can never be sent is answered with a notice saying so: the
// turn settles, rather than ask the agent again after every backoff.
func TestAnAttachmentThatCannotBeSentIsAnsweredWithANotice(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.bin")
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), 2<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	small := filepath.Join(dir, "small.txt")
	if err := os.WriteFile(small, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		file      agent.File
		uploadErr error
		want      string
		uploads   int
	}{
		{"TooLarge", agent.File{Path: big, Caption: "the data"},
			nil, "the data\n\n(The attachment big.bin could not be sent: it is larger than 1 KiB.)", 0},
		{"Missing", agent.File{Path: filepath.Join(dir, "gone.png"), Name: "chart.png"},
			nil, "(The attachment chart.png could not be sent: it could not be read.)", 0},
		{"NotAFile", agent.File{Path: dir},
			nil, "(The attachment " + filepath.Base(dir) + " could not be sent: it is not a file.)", 0},
		{"RefusedByTheHomeserver", agent.File{Path: small},
			&matrix.HTTPError{Status: 413, ErrCode: "M_TOO_LARGE"}, "(The attachment small.txt could not be sent: the homeserver refused it.)", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, _ := viewWithMessage(t)
			tr := &fakeTransport{uploadErr: c.uploadErr}
			a := turnActor(v, answerWith(agent.Reply{Attachment: &c.file}), tr, func(d *Deps) { d.MaxUpload = 1 << 10 })
			if err := a.offer(context.Background(), pendingA(t, v)); err != nil {
				t.Fatal(err)
			}
			if n := len(tr.uploaded()); n != c.uploads {
				t.Fatalf("%d uploads, want %d", n, c.uploads)
			}
			if got := finalContent(t, v); got["msgtype"] != "m.notice" || got["body"] != c.want {
				t.Fatalf("answer = %v, want the notice %q", got, c.want)
			}
		})
	}
}

// An upload that may go through later fails the turn: nothing is recorded
// and the event stays pending, to be offered again.
func TestAnAttachmentWhoseUploadMayGoThroughLaterFailsTheTurn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "chart.png")
	if err := os.WriteFile(path, png, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"Unavailable", &matrix.HTTPError{Status: 502}},
		{"RateLimited", &matrix.HTTPError{Status: 429, ErrCode: "M_LIMIT_EXCEEDED", RetryAfter: time.Second}},
		{"TokenRefused", &matrix.HTTPError{Status: 401, ErrCode: "M_UNKNOWN_TOKEN"}},
		{"Network", errors.New("connection refused")},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, _ := viewWithMessage(t)
			tr := &fakeTransport{uploadErr: c.err}
			a := turnActor(v, answerWith(agent.Reply{Attachment: &agent.File{Path: path}}), tr, nil)
			if err := a.offer(context.Background(), pendingA(t, v)); !errors.Is(err, c.err) {
				t.Fatalf("offer = %v, want the upload's failure", err)
			}
			if _, ok, err := v.TurnForEvent(context.Background(), "$a"); ok || err != nil {
				t.Fatalf("a turn was recorded (%v, %v), want none", ok, err)
			}
			if settled(t, v) {
				t.Fatal("$a settled though its answer was never sent")
			}
		})
	}
}

func TestAnInvalidReplyFailsTheTurn(t *testing.T) {
	v, _ := viewWithMessage(t)
	a := turnActor(v, answerWith(agent.Reply{React: "👍", Content: json.RawMessage(`{"body":"and words"}`)}), &fakeTransport{}, nil)
	if err := a.offer(context.Background(), pendingA(t, v)); !errors.Is(err, agent.ErrInvalidReply) {
		t.Fatalf("offer = %v, want ErrInvalidReply", err)
	}
	if settled(t, v) {
		t.Fatal("$a settled on an invalid reply")
	}
}

func TestTypingIsShownWhileTheAgentAnswersAndWithdrawnWhenItReturns(t *testing.T) {
	v, _ := viewWithMessage(t)
	calls := make(chan typingCall, 1024)
	tr := &fakeTransport{onTyping: func(c typingCall) { calls <- c }}
	const renew = time.Millisecond
	answering := agent.AgentFunc(func(ctx context.Context, _ agent.Turn) (agent.Reply, error) {
		// Shown, then renewed, while the agent is still at it.
		for range 2 {
			select {
			case c := <-calls:
				if !c.typing || c.timeout != renew+renew/2 {
					return agent.Reply{}, errors.New("typing withdrawn while the agent answers")
				}
			case <-ctx.Done():
				return agent.Reply{}, ctx.Err()
			}
		}
		return agent.Reply{Ignore: true}, nil
	})
	a := turnActor(v, answering, tr, func(d *Deps) { d.TypingRenew = renew })
	if err := a.offer(context.Background(), pendingA(t, v)); err != nil {
		t.Fatal(err)
	}
	// Withdrawn once Answer returned (a renewal may have come just before),
	// and nothing after it.
	a.loops.Wait()
	var after []typingCall
	for n := len(calls); n > 0; n-- {
		after = append(after, <-calls)
	}
	if len(after) == 0 || after[len(after)-1].typing {
		t.Fatalf("typing notices after the answer = %+v, want it withdrawn last", after)
	}
	for _, c := range after[:len(after)-1] {
		if !c.typing {
			t.Fatalf("typing notices after the answer = %+v, want it withdrawn once", after)
		}
	}
}

func TestNoTypingIsShownWhenTurnedOffOrForAnEventNotAnswered(t *testing.T) {
	v, _ := viewWithMessage(t)
	var calls atomic.Int32
	tr := &fakeTransport{onTyping: func(typingCall) { calls.Add(1) }}
	a := turnActor(v, answerWith(agent.Reply{Ignore: true}), tr, func(d *Deps) { d.TypingRenew = -1 })
	e := pendingA(t, v)
	if err := a.offer(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	a.loops.Wait()
	if n := calls.Load(); n != 0 {
		t.Fatalf("%d typing notices with typing off, want none", n)
	}
	// A reaction is never answered: no typing either.
	e.Kind = journal.KindReaction
	b := turnActor(v, nil, tr, nil)
	b.typing(context.Background(), e)()
	b.loops.Wait()
	if n := calls.Load(); n != 0 {
		t.Fatalf("%d typing notices for a reaction, want none", n)
	}
}
