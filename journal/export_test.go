package journal_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const (
	exportRoom   = "!export:example.org"
	exportSender = "@alice:example.org"
)

// exportConversation admits n messages $m01..$mNN, one millisecond apart,
// into a journal on an on-disk SQLite file and returns the bot's view.
func exportConversation(t *testing.T, opts store.Options, n int, body func(i int) string) journal.PrincipalStore {
	t.Helper()
	opts.StorageDir = t.TempDir()
	s := testsupport.MustOpenWith(t, opts)
	v, err := s.Principal(t.Context(), "exporter", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]mx.Ev, 0, n)
	for i := 1; i <= n; i++ {
		evs = append(evs, mx.Message(fmt.Sprintf("$m%02d", i), exportSender, int64(1000+i), body(i)))
	}
	admit(t, v, evs...)
	return v
}

func admit(t *testing.T, v journal.PrincipalStore, evs ...mx.Ev) {
	t.Helper()
	res, err := v.AdmitBatch(t.Context(), mx.Live(exportRoom, evs...), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Outcome != journal.Admitted {
			t.Fatalf("admit %s: %v (%v)", r.EventID, r.Outcome, r.Err)
		}
	}
}

// exported runs the plan's second walk and lists every message and every
// owed refetch it yields, in order.
func exported(t *testing.T, ctx context.Context, plan journal.ExportPlan, v journal.ConversationReader, pageSize int) (messages, owed []string) {
	t.Helper()
	for page, err := range plan.Pages(ctx, v, exportRoom, nil, pageSize) {
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range page.Messages {
			messages = append(messages, m.EventID)
		}
		owed = append(owed, page.OwedRefetch...)
	}
	return messages, owed
}

func ids(from, to int, except ...int) []string {
	var out []string
	for i := from; i <= to; i++ {
		if !slices.Contains(except, i) {
			out = append(out, fmt.Sprintf("$m%02d", i))
		}
	}
	return out
}

// Pages reads each older page again from its cursor: a message redacted
// between the two walks must not pull a message of the next older page,
// already written, into the page again. A row owing a refetch is no
// exception.
func TestAMessageRedactedDuringAnExportShowsNoOtherMessageTwice(t *testing.T) {
	const pageSize = 3
	v := exportConversation(t, store.Options{}, 9, func(i int) string { return "text " + fmt.Sprint(i) })
	// $m03, the newest message of the oldest page, shows an edit that is
	// then redacted: it owes a refetch.
	admit(t, v, mx.Edit("$e03", exportSender, 2000, "$m03", "edited"))
	admit(t, v, mx.Redaction("$r03", exportSender, 2001, "$e03"))

	plan, err := journal.PlanExport(t.Context(), v, exportRoom, nil, pageSize, nil)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Len() != 3 {
		t.Fatalf("plan of %d pages, want 3", plan.Len())
	}
	// Redacted between the walks: two messages of the middle page.
	admit(t, v, mx.Redaction("$r05", exportSender, 3000, "$m05"), mx.Redaction("$r06", exportSender, 3001, "$m06"))

	messages, owed := exported(t, t.Context(), plan, v, pageSize)
	if want := ids(1, 9, 3, 5, 6); !slices.Equal(messages, want) {
		t.Errorf("exported messages %v, want %v", messages, want)
	}
	if want := []string{"$m03"}; !slices.Equal(owed, want) {
		t.Errorf("owed refetches %v, want %v", owed, want)
	}
}

// A page read again may also hold fewer rows than it did, when an edit
// made a message larger than the page's budget allows: the rest of that
// page's range is still exported, oldest first, and nothing twice.
func TestAnExportPageThatShrankBetweenTheWalksSkipsNothing(t *testing.T) {
	const pageSize = 4
	// The stored budget fits four short messages but not a long one beside
	// the others.
	opts := store.Options{PageBudget: journal.PageBudget{StoredLimit: 600, DecodedLimit: 1 << 20}}
	v := exportConversation(t, opts, 12, func(i int) string { return "short " + fmt.Sprint(i) })
	plan, err := journal.PlanExport(t.Context(), v, exportRoom, nil, pageSize, nil)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Len() != 3 {
		t.Fatalf("plan of %d pages, want 3", plan.Len())
	}
	// The middle page's newest message grows past what leaves room for its
	// neighbours.
	admit(t, v, mx.Edit("$e08", exportSender, 2000, "$m08", strings.Repeat("long ", 120)))

	messages, owed := exported(t, t.Context(), plan, v, pageSize)
	if want := ids(1, 12); !slices.Equal(messages, want) {
		t.Errorf("exported messages %v, want %v", messages, want)
	}
	if len(owed) != 0 {
		t.Errorf("owed refetches %v, want none", owed)
	}
}
