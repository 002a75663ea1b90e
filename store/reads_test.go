package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/mindroomd/mindroomd/contract"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	ts "github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

func TestReadContract(t *testing.T) { contract.RunReads(t, sqliteFactory) }

func TestReadContractWithEveryRowMergedIntoThePageIndex(t *testing.T) {
	contract.RunReads(t, mergingFactory(1))
}

func TestReadContractWithConversationsSplitBetweenIndexAndTail(t *testing.T) {
	contract.RunReads(t, mergingFactory(3))
}

func TestASingleMessageLargerThanTheBudgetStillFillsAPage(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := store.Open(ctx, store.Options{StorageDir: dir, Now: (&ts.Clock{T: ts.DefaultNow}).Now,
		PageBudget: journal.PageBudget{StoredLimit: 100, DecodedLimit: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, err := s.Principal(ctx, "reader", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	room := "!budget:example.org"
	big := mx.Message("$big", "@alice:example.org", 2000, strings.Repeat("x", 500))
	if _, err := v.AdmitBatch(ctx, mx.Live(room, mx.Message("$small", "@alice:example.org", 1000, "s"), big), ""); err != nil {
		t.Fatal(err)
	}
	p, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Messages) != 1 || p.Messages[0].EventID != "$big" {
		t.Fatalf("page=%+v, want only the oversized message", p.Messages)
	}
	if p.NextCursor == nil || p.NextCursor.EventID != "$big" {
		t.Fatalf("cursor=%+v, want one continuing after $big", p.NextCursor)
	}
	p, err = v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: 10, Before: p.NextCursor})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Messages) != 1 || p.Messages[0].EventID != "$small" || p.NextCursor != nil {
		t.Fatalf("second page=%+v cursor=%v, want $small and the end", p.Messages, p.NextCursor)
	}
}

// Readers run while the writer commits and never see SQLITE_BUSY: they read
// a WAL snapshot and never wait for the writer.
func TestReadersRunWhileTheWriterCommits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, _ := ts.MustOpen(t)
	v, err := s.Principal(ctx, "reader", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	room := "!busy:example.org"
	const writers, batches, perBatch = 8, 40, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers+4)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for b := 0; b < batches; b++ {
				var evs []mx.Ev
				for i := 0; i < perBatch; i++ {
					n := (w*batches+b)*perBatch + i
					evs = append(evs, mx.Message(fmt.Sprintf("$w%06d", n), "@alice:example.org", int64(1000+n), "x"))
				}
				if _, err := v.AdmitBatch(ctx, mx.Live(room, evs...), ""); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	done := make(chan struct{})
	var readers sync.WaitGroup
	reads := make([]int, 4)
	for r := range reads {
		readers.Add(1)
		go func(r int) {
			defer readers.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				for _, err := range journal.Export(ctx, v, room, nil, 50) {
					if err != nil {
						errs <- fmt.Errorf("reader %d: %w", r, err)
						return
					}
				}
				if _, err := v.Pending(ctx, 100, 0); err != nil {
					errs <- fmt.Errorf("reader %d pending: %w", r, err)
					return
				}
				reads[r]++
			}
		}(r)
	}
	wg.Wait()
	close(done)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for r, n := range reads {
		if n == 0 {
			t.Fatalf("reader %d completed no walk while writers ran", r)
		}
	}
	total := 0
	for page, err := range journal.Export(ctx, v, room, nil, 500) {
		if err != nil {
			t.Fatal(err)
		}
		total += len(page.Messages)
	}
	if want := writers * batches * perBatch; total != want {
		t.Fatalf("walk saw %d messages, want %d", total, want)
	}
}
