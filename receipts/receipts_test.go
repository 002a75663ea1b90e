package receipts_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/receipts"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const room = "!room:example.org"

// recorder keeps the receipts sent, and says when one came.
type recorder struct {
	mu   sync.Mutex
	sent []string
	came chan struct{}
}

func (r *recorder) ReadReceipt(_ context.Context, room, eventID string) error {
	r.mu.Lock()
	r.sent = append(r.sent, room+" "+eventID)
	r.mu.Unlock()
	r.came <- struct{}{}
	return nil
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.sent...)
}

func setup(t *testing.T, mode receipts.Mode) (*receipts.Store, *recorder, <-chan struct{}) {
	t.Helper()
	st, _ := testsupport.MustOpen(t)
	v, err := st.Principal(context.Background(), "bot", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	res, err := v.AdmitBatch(context.Background(), mx.Live(room, mx.Message("$a", "@alice:example.org", 1, "one"),
		mx.Message("$b", "@alice:example.org", 2, "two"), mx.Message("$c", "@alice:example.org", 3, "three")), "")
	if err != nil || len(res) != 3 {
		t.Fatalf("admit: %v %v", res, err)
	}
	rec := &recorder{came: make(chan struct{}, 16)}
	r := receipts.New(receipts.Deps{Sender: rec, Mode: mode, Delay: time.Millisecond, Log: zerolog.Nop()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return receipts.Wrap(v, r), rec, done
}

func answer(t *testing.T, s *receipts.Store, eventID string) {
	t.Helper()
	content, err := journal.RelateReply([]byte(`{"msgtype":"m.text","body":"ok"}`), eventID, nil, journal.ReplyPlain)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnqueueAndSettle(context.Background(), journal.FinalReply(room, eventID, nil, content, true)); err != nil {
		t.Fatal(err)
	}
}

// slowLookup is a journal view whose reads of an admitted event take many
// times the receipts' delay, as on a loaded machine.
type slowLookup struct{ journal.PrincipalStore }

func (v slowLookup) AdmittedEvent(ctx context.Context, id string) (journal.AdmittedEvent, bool, error) {
	time.Sleep(20 * time.Millisecond)
	return v.PrincipalStore.AdmittedEvent(ctx, id)
}

func TestOnSettleMarksTheNewestEventDealtWithRead(t *testing.T) {
	s, rec, _ := setup(t, receipts.OnSettle)
	if _, err := s.Settle(context.Background(), "$a", "$b"); err != nil {
		t.Fatal(err)
	}
	<-rec.came
	answer(t, s, "$c")
	<-rec.came
	got := rec.all()
	if len(got) != 2 || got[0] != room+" $b" || got[1] != room+" $c" {
		t.Fatalf("receipts = %v, want the newest of each flush: $b then $c", got)
	}
}

func TestOnAnswerLeavesAnIgnoredEventUnread(t *testing.T) {
	s, rec, _ := setup(t, receipts.OnAnswer)
	if _, err := s.Settle(context.Background(), "$a"); err != nil {
		t.Fatal(err)
	}
	answer(t, s, "$b")
	<-rec.came
	if got := rec.all(); len(got) != 1 || got[0] != room+" $b" {
		t.Fatalf("receipts = %v, want only the answered $b", got)
	}
}

func TestASettlementOfSeveralEventsIsOneReceiptHoweverSlowItsLookups(t *testing.T) {
	s, rec, _ := setup(t, receipts.OnSettle)
	s.PrincipalStore = slowLookup{s.PrincipalStore}
	if _, err := s.Settle(context.Background(), "$a", "$b"); err != nil {
		t.Fatal(err)
	}
	<-rec.came
	answer(t, s, "$c")
	<-rec.came
	if got := rec.all(); len(got) != 2 || got[0] != room+" $b" || got[1] != room+" $c" {
		t.Fatalf("receipts = %v, want $b for the settlement, then $c", got)
	}
}

func TestOffSendsNothing(t *testing.T) {
	s, rec, done := setup(t, receipts.Off)
	answer(t, s, "$a")
	if _, err := s.Settle(context.Background(), "$b"); err != nil {
		t.Fatal(err)
	}
	// Run returns at once for Off, its context still live: nothing can
	// be sent later either.
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run kept running with receipts off")
	}
	if got := rec.all(); len(got) != 0 {
		t.Fatalf("receipts = %v, want none", got)
	}
}
