package journal

import (
	"context"
	"iter"
	"slices"
)

// DefaultExportPage is the page size Export uses when given none.
const DefaultExportPage = 500

// Export walks a whole conversation in explicit bounded pages, newest page
// first, each page oldest message first. It is the only way to read a
// conversation completely: nothing ever materialises it at once. Messages
// owing a refetch are reported in each page's OwedRefetch. The walk stops at
// the first error, which it yields.
func Export(ctx context.Context, r ConversationReader, room string, thread *string, pageSize int) iter.Seq2[Page, error] {
	if pageSize <= 0 {
		pageSize = DefaultExportPage
	}
	return func(yield func(Page, error) bool) {
		req := ReadRequest{RoomID: room, Thread: thread, Limit: pageSize}
		for {
			page, err := r.Read(ctx, req)
			if err != nil {
				yield(Page{}, err)
				return
			}
			if !yield(page, nil) || page.NextCursor == nil {
				return
			}
			req.Before = page.NextCursor
		}
	}
}

// ExportPlan is the first of an oldest-first export's two walks: the
// newest page, kept, and the cursor of every older page. Export reads
// newest first, and a whole conversation is never held at once, so the
// second walk (Pages) reads the older pages again from their cursors.
type ExportPlan struct {
	newest  Page
	cursors []Cursor
}

// PlanExport walks the conversation once, newest page first, calling
// onPage (when set) after each page.
func PlanExport(ctx context.Context, r ConversationReader, room string, thread *string, pageSize int, onPage func()) (ExportPlan, error) {
	var (
		plan  ExportPlan
		first = true
	)
	for page, err := range Export(ctx, r, room, thread, pageSize) {
		if err != nil {
			return ExportPlan{}, err
		}
		if first {
			plan.newest, first = page, false
		}
		if page.NextCursor != nil {
			plan.cursors = append(plan.cursors, *page.NextCursor)
		}
		if onPage != nil {
			onPage()
		}
	}
	return plan, nil
}

// Len is how many pages Pages yields.
func (p ExportPlan) Len() int { return len(p.cursors) + 1 }

// Pages yields the conversation oldest page first: each older page read
// again from its cursor, then the kept newest page. It stops at the first
// read error, which it yields.
//
// The conversation may change between the two walks, and a page read again
// holds what lies below its cursor now. A message redacted in the meantime
// lets rows of the next older page, already yielded, into it: those are
// dropped, each page being compared with the rows the read before it saw.
// A page that now ends above the older page's first row (an edit grew a
// message past what the page's budget leaves for the rest, or rows were
// added) leaves a gap: the gap is planned and yielded first, the same way,
// so no row that was there at the plan is skipped or yielded twice.
func (p ExportPlan) Pages(ctx context.Context, r ConversationReader, room string, thread *string, pageSize int) iter.Seq2[Page, error] {
	if pageSize <= 0 {
		pageSize = DefaultExportPage
	}
	return func(yield func(Page, error) bool) {
		w := &exportWalk{ctx: ctx, r: r, req: ReadRequest{RoomID: room, Thread: thread, Limit: pageSize}, yield: yield}
		for i := len(p.cursors) - 1; i >= 0; i-- {
			var lower *Cursor
			if i+1 < len(p.cursors) {
				lower = &p.cursors[i+1]
			}
			if !w.segment(p.cursors[i], lower) {
				return
			}
		}
		yield(p.newest, nil)
	}
}

// exportWalk is the state of one oldest-first walk.
type exportWalk struct {
	ctx   context.Context
	r     ConversationReader
	req   ReadRequest
	yield func(Page, error) bool
	// seen are the rows (messages and owed refetches) the read of the last
	// page yielded saw: the rows just older than the next page's.
	seen map[string]struct{}
}

// segment yields the rows older than upper and, when lower is set, no
// older than lower, the first row of the page below, as one page or, when
// they no longer fit one, as several, oldest first. It reports whether the
// walk goes on.
func (w *exportWalk) segment(upper Cursor, lower *Cursor) bool {
	page, err := w.read(upper)
	if err != nil {
		w.yield(Page{}, err)
		return false
	}
	read := make(map[string]struct{}, len(page.Messages)+len(page.OwedRefetch))
	for _, m := range page.Messages {
		read[m.EventID] = struct{}{}
	}
	for _, id := range page.OwedRefetch {
		read[id] = struct{}{}
	}
	page.Messages = slices.DeleteFunc(page.Messages, func(m Message) bool { _, ok := w.seen[m.EventID]; return ok })
	page.OwedRefetch = slices.DeleteFunc(page.OwedRefetch, func(id string) bool { _, ok := w.seen[id]; return ok })
	if lower != nil && page.NextCursor != nil && cursorAfter(*page.NextCursor, *lower) {
		// The page stopped short of lower: plan the gap, then yield it
		// before this page, which is newer.
		gap := []Cursor{*page.NextCursor}
		for {
			p, err := w.read(gap[len(gap)-1])
			if err != nil {
				w.yield(Page{}, err)
				return false
			}
			if p.NextCursor == nil || !cursorAfter(*p.NextCursor, *lower) {
				break
			}
			gap = append(gap, *p.NextCursor)
		}
		for j := len(gap) - 1; j >= 0; j-- {
			lo := lower
			if j+1 < len(gap) {
				lo = &gap[j+1]
			}
			if !w.segment(gap[j], lo) {
				return false
			}
		}
	}
	w.seen = read
	return w.yield(page, nil)
}

func (w *exportWalk) read(before Cursor) (Page, error) {
	req := w.req
	req.Before = &before
	return w.r.Read(w.ctx, req)
}

// cursorAfter reports whether a is newer than b in page order: by
// created_ts, then event ID in byte order.
func cursorAfter(a, b Cursor) bool {
	if a.CreatedTS != b.CreatedTS {
		return a.CreatedTS > b.CreatedTS
	}
	return a.EventID > b.EventID
}
