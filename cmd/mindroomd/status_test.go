package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// runAt runs one command line with the clock at now.
func runAt(t *testing.T, now time.Time, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	m := NewMain(&out, io.Discard)
	m.now = func() time.Time { return now }
	ctx := context.Background()
	if err := m.ParseFlags(ctx, args); err != nil {
		return out.String(), err
	}
	err := m.Run(ctx)
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	return out.String(), err
}

// columns splits the table's cells: they are separated by two spaces or
// more, and a header may hold single spaces.
var columns = regexp.MustCompile(`\s{2,}`)

// statusRows reads status's table into one map per principal, from column
// header to cell.
func statusRows(t *testing.T, out string) map[string]map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	head := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "PRINCIPAL ") {
			head = i
		}
	}
	if head < 0 {
		t.Fatalf("status printed no table:\n%s", out)
	}
	names := columns.Split(strings.TrimSpace(lines[head]), -1)
	rows := make(map[string]map[string]string)
	for _, l := range lines[head+1:] {
		if strings.TrimSpace(l) == "" {
			break // the devices' table follows
		}
		cells := columns.Split(strings.TrimSpace(l), -1)
		if len(cells) != len(names) {
			t.Fatalf("row %q has %d cells for %d columns:\n%s", l, len(cells), len(names), out)
		}
		row := make(map[string]string, len(names))
		for i, n := range names {
			row[n] = cells[i]
		}
		rows[cells[0]] = row
	}
	return rows
}

// replies gives v, in room, a different number of replies in each outbox
// state: queued 1, attempted 2, acknowledged 3, failed 4, retired 5.
func replies(t *testing.T, v journal.PrincipalStore, room string) {
	t.Helper()
	ctx := context.Background()
	for i, state := range []journal.DeliveryState{journal.DeliveryQueued, journal.DeliveryAttempted,
		journal.DeliveryAcknowledged, journal.DeliveryFailed, journal.DeliveryRetired} {
		for j := range i + 1 {
			source := fmt.Sprintf("$%s-%d", state, j)
			if _, err := v.AdmitBatch(ctx, mx.Live(room, mx.Message(source, "@alice:example.org", int64(1000+10*i+j), "q")), ""); err != nil {
				t.Fatal(err)
			}
			id := journal.ReplyDeliveryID(source)
			if _, err := v.EnqueueAndSettle(ctx, journal.EnqueueRequest{DeliveryID: id, Stage: journal.StageFinal,
				RoomID: room, Content: []byte(`{"msgtype":"m.text","body":"a"}`), Sources: []string{source}}); err != nil {
				t.Fatal(err)
			}
			var err error
			switch state {
			case journal.DeliveryRetired:
				err = v.Retire(ctx, id, journal.StageFinal)
			case journal.DeliveryAttempted, journal.DeliveryAcknowledged, journal.DeliveryFailed:
				_, err = v.Claim(ctx, id, journal.StageFinal, "DEVICE")
			}
			if err != nil {
				t.Fatal(err)
			}
			switch state {
			case journal.DeliveryAcknowledged:
				_, err = v.Acknowledge(ctx, id, journal.StageFinal, journal.Sent{EventID: "$sent" + source[1:]})
			case journal.DeliveryFailed:
				err = v.Fail(ctx, id, journal.StageFinal, "M_FORBIDDEN", true)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Each figure lands in its own column, for its own principal: the counts
// differ from column to column, so a swap shows.
func TestStatusPrintsEachFigureOfEachPrincipal(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := testsupport.MustOpenWith(t, store.Options{StorageDir: dir, Now: (&testsupport.Clock{T: testsupport.DefaultNow}).Now})
	helper, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Principal(ctx, "quiet", "@quiet:example.org"); err != nil {
		t.Fatal(err)
	}
	const room = "!r:example.org"
	replies(t, helper, room)
	// Six pending messages, and the sync that brought them stored its token.
	var pending []mx.Ev
	for i := range 6 {
		pending = append(pending, mx.Message(fmt.Sprintf("$p%d", i), "@alice:example.org", int64(2000+i), "new"))
	}
	if _, err := helper.AdmitBatch(ctx, mx.Live(room, pending...), "s_1"); err != nil {
		t.Fatal(err)
	}
	// Two local leaves of another room, a rejoin between them, owe two
	// echoes.
	const left = "!left:example.org"
	for i, leave := range []string{"leave-1", "leave-2"} {
		if i > 0 {
			if err := helper.RecordJoin(ctx, left, "join-1"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := helper.FenceDeparture(ctx, left, journal.DepartureLocal, leave); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	out, err := runAt(t, testsupport.DefaultNow.Add(90*time.Second+400*time.Millisecond), "status", "-storage", dir)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	rows := statusRows(t, out)
	for principal, want := range map[string]map[string]string{
		"helper@@helper:example.org": {"EVENTS": "21", "PENDING": "6", "VISIBLE": "21", "QUEUED": "1", "ATTEMPTED": "2",
			"ACKNOWLEDGED": "3", "FAILED": "4", "RETIRED": "5", "OWED DEPARTURES": "2", "AWAITING KEYS": "0",
			"UNDECRYPTABLE": "0", "SYNC TOKEN AGE": "1m30s"},
		"quiet@@quiet:example.org": {"EVENTS": "0", "PENDING": "0", "VISIBLE": "0", "QUEUED": "0", "ATTEMPTED": "0",
			"ACKNOWLEDGED": "0", "FAILED": "0", "RETIRED": "0", "OWED DEPARTURES": "0", "SYNC TOKEN AGE": "none"},
	} {
		got, ok := rows[principal]
		if !ok {
			t.Fatalf("no row for %s:\n%s", principal, out)
		}
		for col, w := range want {
			if got[col] != w {
				t.Errorf("%s %s = %q, want %q", principal, col, got[col], w)
			}
		}
	}
	fi, err := os.Stat(sqlitefs.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	// The daemon stopped in order: its WAL is checkpointed and gone.
	if want := fmt.Sprintf("\ndatabase %s, WAL 0 B\n", size(fi.Size())); !strings.Contains(out, want) {
		t.Fatalf("status output lacks %q:\n%s", want, out)
	}
	if t.Failed() {
		t.Logf("status output:\n%s", out)
	}
}

// A token stored by a mindroomd that kept no time (before schema v4) has
// an age status cannot know, and says so.
func TestStatusSaysWhenASyncTokensTimeIsUnknown(t *testing.T) {
	dir := closedJournal(t) // its one sync stored token "tok"
	raw := rawJournal(t, dir, "")
	if _, err := raw.Exec(forgetTokenTime); err != nil {
		t.Fatal(err)
	}
	if err := raw.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "status", "-storage", dir)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if got := statusRows(t, out)["helper@@helper:example.org"]["SYNC TOKEN AGE"]; got != "unknown" {
		t.Fatalf("sync token age = %q, want unknown:\n%s", got, out)
	}
}

// forgetTokenTime leaves a token as a journal migrated from v3 holds it.
const forgetTokenTime = `UPDATE principals SET sync_token_ms = 0`

func TestASyncTokensAgeIsReadOffTheClock(t *testing.T) {
	stored := testsupport.DefaultNow
	for _, tc := range []struct {
		name string
		s    journal.PrincipalStatus
		now  time.Time
		want string
	}{
		{"NoToken", journal.PrincipalStatus{}, stored, "none"},
		{"TimeUnknown", journal.PrincipalStatus{HasSyncToken: true}, stored, "unknown"},
		{"JustNow", journal.PrincipalStatus{HasSyncToken: true, SyncTokenMS: stored.UnixMilli()}, stored, "0s"},
		{"Hours", journal.PrincipalStatus{HasSyncToken: true, SyncTokenMS: stored.UnixMilli()}, stored.Add(26*time.Hour + 3*time.Minute + 700*time.Millisecond), "26h3m1s"},
		{"ClockSetBack", journal.PrincipalStatus{HasSyncToken: true, SyncTokenMS: stored.UnixMilli()}, stored.Add(-time.Hour), "0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := syncAge(tc.s, tc.now); got != tc.want {
				t.Fatalf("syncAge = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFileSizesAreSpelledInBinaryUnitsWithTheirBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0:             "0 B",
		1023:          "1023 B",
		1024:          "1.0 KiB (1024 bytes)",
		1536:          "1.5 KiB (1536 bytes)",
		64 << 20:      "64.0 MiB (67108864 bytes)",
		5<<30 + 1<<29: "5.5 GiB (5905580032 bytes)",
	} {
		if got := size(n); got != want {
			t.Errorf("size(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestStatusShowsWhatRetentionPrunedAndTheOldestMessageKept(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := &testsupport.ShiftClock{Base: testsupport.DefaultNow}
	s := testsupport.MustOpenWith(t, store.Options{StorageDir: dir, Now: clock.Now})
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	const room = "!r:example.org"
	if _, err := v.AdmitBatch(ctx, mx.Live(room, mx.Message("$old", "@alice:example.org", 1000, "old")), "s_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Settle(ctx, "$old"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	kept := testsupport.DefaultNow.Add(time.Hour).UnixMilli()
	if _, err := v.AdmitBatch(ctx, mx.Live(room, mx.Message("$new", "@alice:example.org", kept, "new")), "s_2"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Settle(ctx, "$new"); err != nil {
		t.Fatal(err)
	}
	n, err := v.Retain(ctx, journal.RetentionPolicy{Bodies: time.Hour})
	if err != nil || n.Bodies != 1 {
		t.Fatalf("retention pruned %+v, %v; want the old body", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := runAt(t, testsupport.DefaultNow.Add(2*time.Hour+time.Minute), "status", "-storage", dir)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	_, table, ok := strings.Cut(out, "\nRETENTION")
	want := strings.Fields(fmt.Sprintf("helper@@helper:example.org 1 1m0s ago 1 %s %s", size(n.Bytes),
		time.UnixMilli(kept).UTC().Format(time.RFC3339)))
	lines := strings.Split(table, "\n")
	if !ok || len(lines) < 2 || strings.Join(strings.Fields(lines[1]), " ") != strings.Join(want, " ") {
		t.Fatalf("status output lacks the retention line %q:\n%s", want, out)
	}
}
