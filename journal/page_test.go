package journal_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// row is one stored row as a store offers it: ID, time, body ("" for a row
// owing a refetch).
type row struct {
	id   string
	ts   int64
	body string
}

func (r row) message() (journal.Message, bool) {
	m := journal.Message{EventID: r.id, CreatedTS: r.ts}
	if r.body != "" {
		m.Content = []byte(r.body)
	}
	return m, r.body != ""
}

// build offers rows newest first as a store reads them, then the root
// when every reply was taken, and returns the page in short form:
// "messages | owed | cursor".
func build(limit int, budget journal.PageBudget, rows []row, root *row) string {
	b := journal.NewPageBuilder(limit, budget)
	for _, r := range rows {
		if !b.Add(r.message()) {
			break
		}
	}
	if root != nil && !b.Full() {
		b.Add(root.message())
	}
	p := b.Page()
	ids := make([]string, len(p.Messages))
	for i, m := range p.Messages {
		ids[i] = m.EventID
	}
	cursor := "end"
	if p.NextCursor != nil {
		cursor = p.NextCursor.EventID
	}
	return strings.Join(ids, ",") + " | " + strings.Join(p.OwedRefetch, ",") + " | " + cursor
}

func TestPageBuilder(t *testing.T) {
	e, d, c, b, a := row{"$e", 5, "{}"}, row{"$d", 4, "{}"}, row{"$c", 3, "{}"}, row{"$b", 2, ""}, row{"$a", 1, "{}"}
	root := row{"$root", 0, "{}"}
	big := func(r row) row { r.body = `"` + strings.Repeat("x", 30) + `"`; return r }
	for _, tc := range []struct {
		name   string
		limit  int
		budget journal.PageBudget
		rows   []row
		root   *row
		want   string
	}{
		{"AShortConversationEndsWithoutACursor", 10, journal.PageBudget{}, []row{e, d, c}, nil, "$c,$d,$e |  | end"},
		{"ARowBeyondTheLimitLeavesACursorAtTheOldestRead", 2, journal.PageBudget{}, []row{e, d, c}, nil, "$d,$e |  | $d"},
		{"RowsOwingARefetchAreListedAndCountAgainstTheLimit", 3, journal.PageBudget{}, []row{d, c, b, a}, nil, "$c,$d | $b | $b"},
		{"TheRootClosesTheThreadsLastPage", 5, journal.PageBudget{}, []row{e, d}, &root, "$root,$d,$e |  | end"},
		{"ARootOwingARefetchIsListed", 5, journal.PageBudget{}, []row{e}, &row{"$root", 0, ""}, "$e | $root | end"},
		{"ARootBeyondTheLimitWaitsForTheNextPage", 2, journal.PageBudget{}, []row{e, d}, &root, "$d,$e |  | $d"},
		{"ANextPageOfNoRepliesHoldsTheRoot", 2, journal.PageBudget{}, nil, &root, "$root |  | end"},
		{"TheBudgetEndsAPage", 10, journal.PageBudget{StoredLimit: 40}, []row{big(e), big(d), c}, nil, "$e |  | $e"},
		{"TheFirstMessageFitsWhateverItsSize", 10, journal.PageBudget{StoredLimit: 8}, []row{big(e)}, nil, "$e |  | end"},
		{"ARootOverTheBudgetWaitsForTheNextPage", 10, journal.PageBudget{StoredLimit: 40}, []row{big(e)}, &row{"$root", 0, big(root).body}, "$e |  | $e"},
		{"ARowOwingARefetchDoesNotEndAPage", 10, journal.PageBudget{StoredLimit: 40}, []row{big(e), b, c}, nil, "$c,$e | $b | end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := build(tc.limit, tc.budget, tc.rows, tc.root); got != tc.want {
				t.Fatalf("page = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLatestVisibleID(t *testing.T) {
	boom := errors.New("boom")
	for _, c := range []struct {
		name              string
		logical, revision string
		bodyless          bool
		redacted          bool
		err               error
		want              string
		asks              bool
	}{
		{"AnOriginalOnScreen", "$o", "$o", false, false, nil, "$o", false},
		{"AnEditOnScreen", "$o", "$e", false, false, nil, "$e", false},
		{"AnOriginalOwingARefetch", "$o", "$o", true, false, nil, "$o", false},
		{"AnEditOwingARefetch", "$o", "$e", true, false, nil, "$e", true},
		{"ARedactedEditAnswersToTheLogicalID", "$o", "$e", true, true, nil, "$o", true},
		{"TheProbesErrorIsReturned", "$o", "$e", true, false, boom, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			asked := false
			got, err := journal.LatestVisibleID(c.logical, c.revision, c.bodyless, func() (bool, error) {
				asked = true
				return c.redacted, c.err
			})
			if got != c.want || !errors.Is(err, c.err) || asked != c.asks {
				t.Fatalf("= %q, %v (asked %v); want %q, %v (asked %v)", got, err, asked, c.want, c.err, c.asks)
			}
		})
	}
}

func TestValidateReadBoundsTheLimit(t *testing.T) {
	req := journal.ReadRequest{RoomID: "!r:example.org", Limit: journal.MaxPageLimit}
	if _, err := journal.ValidateRead(req); err != nil {
		t.Fatalf("limit %d refused: %v", req.Limit, err)
	}
	req.Limit++
	if _, err := journal.ValidateRead(req); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Fatalf("limit %d: err = %v, want ErrInvalidArgument", req.Limit, err)
	}
}
