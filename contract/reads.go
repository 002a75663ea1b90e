package contract

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const (
	readsRoom  = "!reads:example.org"
	readsOther = "!other:example.org"
	readsBot   = "@bot:example.org"
	readsAlice = "@alice:example.org"
	// readsT0 is a timestamp near the test clock, so no event is absurd.
	readsT0 = int64(1_790_000_000_000)
)

// RunReads runs the bounded-read areas.
func RunReads(t *testing.T, f Factory) {
	t.Run("BoundedReads", func(t *testing.T) { TestBoundedReads(t, f) })
	t.Run("PageBudgets", func(t *testing.T) { TestPageBudgets(t, f) })
	t.Run("APageIsBoundedByTheRowsItReads", func(t *testing.T) { TestAPageIsBoundedByTheRowsItReads(t, f) })
}

func readsView(t *testing.T, f Factory) journal.PrincipalStore {
	t.Helper()
	s := f(t).Open(t)
	t.Cleanup(func() { _ = s.Close() })
	v, err := s.Principal(context.Background(), "reader", readsBot)
	if err != nil {
		t.Fatalf("principal: %v", err)
	}
	return v
}

func readsAdmit(t *testing.T, v journal.Admission, room string, evs ...mx.Ev) {
	t.Helper()
	res, err := v.AdmitBatch(context.Background(), mx.Live(room, evs...), "")
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	for _, r := range res {
		if r.Outcome != journal.Admitted {
			t.Fatalf("admit %s: %s %v", r.EventID, r.Outcome, r.Err)
		}
	}
}

func readsRead(t *testing.T, v journal.ConversationReader, req journal.ReadRequest) journal.Page {
	t.Helper()
	p, err := v.Read(context.Background(), req)
	if err != nil {
		t.Fatalf("read %+v: %v", req, err)
	}
	return p
}

func readsIDs(p journal.Page) string {
	out := make([]string, len(p.Messages))
	for i, m := range p.Messages {
		out[i] = m.EventID
	}
	return strings.Join(out, ",")
}

// walk pages a conversation to its end and returns every page's IDs, in the
// order the pages came (newest page first).
func readsWalk(t *testing.T, v journal.ConversationReader, room string, thread *string, limit int) []string {
	t.Helper()
	var pages []string
	for page, err := range journal.Export(context.Background(), v, room, thread, limit) {
		if err != nil {
			t.Fatalf("walk: %v", err)
		}
		if len(page.Messages) > limit {
			t.Fatalf("page of %d exceeds limit %d", len(page.Messages), limit)
		}
		pages = append(pages, readsIDs(page))
		if len(pages) > 10000 {
			t.Fatal("walk does not end")
		}
	}
	return pages
}

func readsStr(s string) *string { return &s }

// TestBoundedReads covers paging, ordering, threads and their roots.
func TestBoundedReads(t *testing.T, f Factory) {
	ctx := context.Background()
	t.Run("AReadRequiresAPositiveLimit", func(t *testing.T) {
		v := readsView(t, f)
		for _, limit := range []int{0, -1} {
			_, err := v.Read(ctx, journal.ReadRequest{RoomID: readsRoom, Limit: limit})
			if !errors.Is(err, journal.ErrInvalidArgument) {
				t.Fatalf("limit %d: err=%v, want ErrInvalidArgument", limit, err)
			}
		}
	})
	t.Run("PagesWalkBackwardsWithoutGapsOrRepeats", func(t *testing.T) {
		v := readsView(t, f)
		var evs []mx.Ev
		for i := 0; i < 23; i++ {
			evs = append(evs, mx.Message(fmt.Sprintf("$m%02d", i), readsAlice, readsT0+int64(i), "x"))
		}
		readsAdmit(t, v, readsRoom, evs...)
		got := strings.Join(readsWalk(t, v, readsRoom, nil, 5), "|")
		want := "$m18,$m19,$m20,$m21,$m22|$m13,$m14,$m15,$m16,$m17|$m08,$m09,$m10,$m11,$m12|$m03,$m04,$m05,$m06,$m07|$m00,$m01,$m02"
		if got != want {
			t.Fatalf("walk=%s\nwant %s", got, want)
		}
	})
	t.Run("APageIsChronologicalEvenWhenAdmittedOutOfOrder", func(t *testing.T) {
		v := readsView(t, f)
		readsAdmit(t, v, readsRoom,
			mx.Message("$c", readsAlice, readsT0+3, "c"),
			mx.Message("$a", readsAlice, readsT0+1, "a"),
			mx.Message("$b", readsAlice, readsT0+2, "b"))
		if got, want := readsIDs(readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Limit: 10})), "$a,$b,$c"; got != want {
			t.Fatalf("page=%s, want %s", got, want)
		}
	})
	t.Run("ACursorIsSetOnlyWhenMoreMayExist", func(t *testing.T) {
		v := readsView(t, f)
		readsAdmit(t, v, readsRoom, mx.Message("$a", readsAlice, readsT0+1, "a"), mx.Message("$b", readsAlice, readsT0+2, "b"))
		if p := readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Limit: 2}); p.NextCursor != nil {
			t.Fatalf("exact page carries cursor %+v", p.NextCursor)
		}
		p := readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Limit: 1})
		if p.NextCursor == nil || *p.NextCursor != (journal.Cursor{CreatedTS: readsT0 + 2, EventID: "$b"}) {
			t.Fatalf("cursor=%+v, want the page's oldest message", p.NextCursor)
		}
	})
	t.Run("ThreadsAreSeparateConversations", func(t *testing.T) {
		v := readsView(t, f)
		readsAdmit(t, v, readsRoom,
			mx.Message("$root", readsAlice, readsT0+1, "root"),
			mx.ThreadReply("$r1", readsAlice, readsT0+2, "$root", "r1"),
			mx.Message("$room2", readsAlice, readsT0+3, "room2"),
			mx.Message("$other", readsAlice, readsT0+4, "other root"),
			mx.ThreadReply("$o1", readsAlice, readsT0+5, "$other", "o1"))
		if got, want := readsIDs(readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Limit: 10})), "$root,$room2,$other"; got != want {
			t.Fatalf("room page=%s, want %s (a thread root belongs to the room)", got, want)
		}
		if got, want := readsIDs(readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Thread: readsStr("$root"), Limit: 10})), "$root,$r1"; got != want {
			t.Fatalf("thread page=%s, want %s", got, want)
		}
		if got, want := readsIDs(readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Thread: readsStr("$other"), Limit: 10})), "$other,$o1"; got != want {
			t.Fatalf("other thread=%s, want %s", got, want)
		}
		if got := readsIDs(readsRead(t, v, journal.ReadRequest{RoomID: readsOther, Limit: 10})); got != "" {
			t.Fatalf("another room reads %s", got)
		}
	})
	t.Run("TheRootAppearsOnceEvenWhenItIsAlsoAReply", func(t *testing.T) {
		v := readsView(t, f)
		readsAdmit(t, v, readsRoom,
			mx.ThreadReply("$root", readsAlice, readsT0+1, "$root", "claims its own thread"),
			mx.ThreadReply("$r1", readsAlice, readsT0+2, "$root", "r1"))
		if got, want := readsIDs(readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Thread: readsStr("$root"), Limit: 10})), "$root,$r1"; got != want {
			t.Fatalf("thread page=%s, want %s", got, want)
		}
	})
	t.Run("AThreadPageRespectsItsLimitWithTheRootMergedAndReachesTheRootLast", func(t *testing.T) {
		v := readsView(t, f)
		evs := []mx.Ev{mx.Message("$root", readsAlice, readsT0, "root")}
		for i := 1; i <= 6; i++ {
			evs = append(evs, mx.ThreadReply(fmt.Sprintf("$r%d", i), readsAlice, readsT0+int64(i), "$root", "r"))
		}
		readsAdmit(t, v, readsRoom, evs...)
		got := strings.Join(readsWalk(t, v, readsRoom, readsStr("$root"), 3), "|")
		if want := "$r4,$r5,$r6|$r1,$r2,$r3|$root"; got != want {
			t.Fatalf("thread walk=%s, want %s", got, want)
		}
		got = strings.Join(readsWalk(t, v, readsRoom, readsStr("$root"), 4), "|")
		if want := "$r3,$r4,$r5,$r6|$root,$r1,$r2"; got != want {
			t.Fatalf("thread walk=%s, want %s", got, want)
		}
	})
	t.Run("OrderingIsByteOrderForMixedCaseIDs", func(t *testing.T) {
		v := readsView(t, f)
		// Same millisecond: byte order puts upper case before lower case.
		readsAdmit(t, v, readsRoom,
			mx.Message("$b", readsAlice, readsT0, "b"),
			mx.Message("$B", readsAlice, readsT0, "B"),
			mx.Message("$a", readsAlice, readsT0, "a"),
			mx.Message("$A", readsAlice, readsT0, "A"),
			mx.Message("$_", readsAlice, readsT0, "_"))
		if got, want := readsIDs(readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Limit: 10})), "$A,$B,$_,$a,$b"; got != want {
			t.Fatalf("page=%s, want %s", got, want)
		}
		if got, want := strings.Join(readsWalk(t, v, readsRoom, nil, 2), "|"), "$a,$b|$B,$_|$A"; got != want {
			t.Fatalf("walk across the tie=%s, want %s", got, want)
		}
	})
	t.Run("RowsOfOneMillisecondAreWalkedOnceEachAcrossEveryCursor", func(t *testing.T) {
		// Every row shares its created_ts, so only the event-ID tie-break
		// separates one page from the next. Rows come in several batches,
		// out of order, in the room and in a thread.
		v := readsView(t, f)
		root := "$T"
		readsAdmit(t, v, readsRoom, mx.Message(root, readsAlice, readsT0-1, "root"))
		var roomIDs, threadIDs []string
		for batch := 0; batch < 4; batch++ {
			var evs []mx.Ev
			for i := 0; i < 9; i++ {
				n := (i*7 + batch*3) % 9 // out of order within a batch
				id := fmt.Sprintf("$%c%d", 'a'+rune(n), batch)
				if n%2 == 0 {
					evs = append(evs, mx.Message(id, readsAlice, readsT0, "r"))
					roomIDs = append(roomIDs, id)
				} else {
					evs = append(evs, mx.ThreadReply(id, readsAlice, readsT0, root, "t"))
					threadIDs = append(threadIDs, id)
				}
			}
			readsAdmit(t, v, readsRoom, evs...)
		}
		slices.Sort(roomIDs)
		slices.Sort(threadIDs)
		roomWant := append([]string{root}, roomIDs...)
		threadWant := append([]string{root}, threadIDs...)
		for _, limit := range []int{1, 2, 3, 7} {
			for _, c := range []struct {
				thread *string
				want   []string
			}{{nil, roomWant}, {&root, threadWant}} {
				var got []string
				pages := readsWalk(t, v, readsRoom, c.thread, limit)
				for i := len(pages) - 1; i >= 0; i-- {
					if pages[i] != "" {
						got = append(got, strings.Split(pages[i], ",")...)
					}
				}
				if !slices.Equal(got, c.want) {
					t.Fatalf("thread %v, limit %d: walked %v\nwant   %v", c.thread, limit, got, c.want)
				}
			}
		}
	})
	t.Run("RowsOwingARefetchAreReportedAndOmitted", func(t *testing.T) {
		v := readsView(t, f)
		readsAdmit(t, v, readsRoom,
			mx.Message("$a", readsAlice, readsT0+1, "a"),
			mx.Sidecar("$side", readsAlice, readsT0+2, "preview only"),
			mx.Message("$c", readsAlice, readsT0+3, "c"))
		p := readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Limit: 10, Strict: false})
		if got, want := readsIDs(p), "$a,$c"; got != want {
			t.Fatalf("page=%s, want %s", got, want)
		}
		if got, want := strings.Join(p.OwedRefetch, ","), "$side"; got != want {
			t.Fatalf("owed=%s, want %s", got, want)
		}
	})
	t.Run("ExportWalksEverythingInPages", func(t *testing.T) {
		v := readsView(t, f)
		var evs []mx.Ev
		for i := 0; i < 57; i++ {
			evs = append(evs, mx.Message(fmt.Sprintf("$e%03d", i), readsAlice, readsT0+int64(i), "x"))
		}
		readsAdmit(t, v, readsRoom, evs...)
		seen := map[string]bool{}
		for _, page := range readsWalk(t, v, readsRoom, nil, 10) {
			for _, id := range strings.Split(page, ",") {
				if seen[id] {
					t.Fatalf("%s exported twice", id)
				}
				seen[id] = true
			}
		}
		if len(seen) != 57 {
			t.Fatalf("exported %d messages, want 57", len(seen))
		}
	})
}

// bigBody returns a message body of about n bytes of plain text.
func readsBody(n int) string { return strings.Repeat("x", n) }

// TestPageBudgets covers the per-page memory budgets at their real sizes.
func TestPageBudgets(t *testing.T, f Factory) {
	t.Run("StoredContentEndsAPageAt16MiBWithACursor", func(t *testing.T) {
		v := readsView(t, f)
		const n, size = 300, 60 << 10 // 300 × 60 KiB ≈ 17.6 MiB > 16 MiB
		for i := 0; i < n; i += 50 {
			var evs []mx.Ev
			for j := i; j < i+50; j++ {
				evs = append(evs, mx.Message(fmt.Sprintf("$big%03d", j), readsAlice, readsT0+int64(j), readsBody(size)))
			}
			readsAdmit(t, v, readsRoom, evs...)
		}
		p := readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Limit: 1000})
		stored := 0
		for _, m := range p.Messages {
			stored += len(m.Content)
		}
		if stored > journal.PageStoredBudget {
			t.Fatalf("page holds %d bytes, over the %d budget", stored, journal.PageStoredBudget)
		}
		if len(p.Messages) >= n || p.NextCursor == nil {
			t.Fatalf("page of %d messages, cursor %v: the budget did not end it", len(p.Messages), p.NextCursor)
		}
		if got, want := p.NextCursor.EventID, p.Messages[0].EventID; got != want {
			t.Fatalf("cursor at %s, want the page's oldest message %s", got, want)
		}
		total := 0
		for _, page := range readsWalk(t, v, readsRoom, nil, 1000) {
			total += len(strings.Split(page, ","))
		}
		if total != n {
			t.Fatalf("walk saw %d messages, want %d", total, n)
		}
	})
	t.Run("DecodedSizeEndsAPageAt64MiB", func(t *testing.T) {
		v := readsView(t, f)
		// Nested empty arrays cost far more decoded than stored.
		nested := strings.TrimSuffix(strings.Repeat("[],", 20000), ",")
		const n = 40
		var evs []mx.Ev
		for i := 0; i < n; i++ {
			e := mx.Message(fmt.Sprintf("$deep%02d", i), readsAlice, readsT0+int64(i), "deep")
			e["content"].(map[string]any)["x"] = readsRawJSON("[" + nested + "]")
			evs = append(evs, e)
		}
		readsAdmit(t, v, readsRoom, evs...)
		p := readsRead(t, v, journal.ReadRequest{RoomID: readsRoom, Limit: 1000})
		var decoded int64
		for _, m := range p.Messages {
			decoded += journal.EstimateDecoded(m.Content)
		}
		if decoded > journal.PageDecodedBudget {
			t.Fatalf("page decodes to ~%d bytes, over the %d budget", decoded, journal.PageDecodedBudget)
		}
		if len(p.Messages) == 0 || len(p.Messages) >= n || p.NextCursor == nil {
			t.Fatalf("page of %d messages, cursor %v: the decoded budget did not end it", len(p.Messages), p.NextCursor)
		}
	})
}

// TestAPageIsBoundedByTheRowsItReads covers the pending pages' row bound.
func TestAPageIsBoundedByTheRowsItReads(t *testing.T, f Factory) {
	ctx := context.Background()
	setup := func(t *testing.T, n int, corrupt ...int) (journal.PrincipalStore, []string) {
		b := f(t)
		s := b.Open(t)
		t.Cleanup(func() { _ = s.Close() })
		v, err := s.Principal(ctx, "reader", readsBot)
		if err != nil {
			t.Fatal(err)
		}
		var evs []mx.Ev
		var want []string
		for i := 0; i < n; i++ {
			evs = append(evs, mx.Message(fmt.Sprintf("$p%02d", i), readsAlice, readsT0+int64(i), "x"))
		}
		readsAdmit(t, v, readsRoom, evs...)
		bad := map[int]bool{}
		for _, i := range corrupt {
			bad[i] = true
			b.CorruptPayload(t, v.Principal(), fmt.Sprintf("$p%02d", i))
		}
		for i := 0; i < n; i++ {
			if !bad[i] {
				want = append(want, fmt.Sprintf("$p%02d", i))
			}
		}
		return v, want
	}
	pendingIDs := func(p journal.PendingPage) string {
		out := make([]string, len(p.Events))
		for i, e := range p.Events {
			out[i] = e.EventID
		}
		return strings.Join(out, ",")
	}
	t.Run("APageStopsAtItsRowLimitWithReadableWorkBehindIt", func(t *testing.T) {
		v, _ := setup(t, 5)
		p, err := v.Pending(ctx, 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := pendingIDs(p), "$p00,$p01"; got != want || !p.More {
			t.Fatalf("page=%s more=%v, want %s and more", got, p.More, want)
		}
	})
	t.Run("ACorruptPrefixCostsOnlyTheRowsItRead", func(t *testing.T) {
		v, _ := setup(t, 6, 0, 1, 2)
		p, err := v.Pending(ctx, 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Events) != 0 || len(p.Unreadable) != 2 || !p.More {
			t.Fatalf("page: %d events, %d unreadable, more=%v; want 0, 2, more", len(p.Events), len(p.Unreadable), p.More)
		}
		p, err = v.Pending(ctx, 2, p.Next)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := pendingIDs(p), "$p03"; got != want || len(p.Unreadable) != 1 {
			t.Fatalf("second page=%s unreadable=%d, want %s and 1", got, len(p.Unreadable), want)
		}
	})
	t.Run("APassResumesPastWhatItRead", func(t *testing.T) {
		v, want := setup(t, 9, 4)
		var got []string
		after := int64(0)
		for pass := 0; ; pass++ {
			p, err := v.Pending(ctx, 3, after)
			if err != nil {
				t.Fatal(err)
			}
			if p.Next < after {
				t.Fatalf("cursor moved back from %d to %d", after, p.Next)
			}
			for _, e := range p.Events {
				got = append(got, e.EventID)
			}
			after = p.Next
			if !p.More {
				break
			}
			if pass > 10 {
				t.Fatal("backlog never ends")
			}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("passes read %v, want %v", got, want)
		}
	})
}

// readsRawJSON embeds literal JSON in an event under construction.
type readsRawJSON string

// MarshalJSON implements json.Marshaler.
func (r readsRawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }
