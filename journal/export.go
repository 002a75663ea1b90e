package journal

import (
	"context"
	"iter"
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
func (p ExportPlan) Pages(ctx context.Context, r ConversationReader, room string, thread *string, pageSize int) iter.Seq2[Page, error] {
	if pageSize <= 0 {
		pageSize = DefaultExportPage
	}
	return func(yield func(Page, error) bool) {
		for i := len(p.cursors) - 1; i >= 0; i-- {
			page, err := r.Read(ctx, ReadRequest{RoomID: room, Thread: thread, Limit: pageSize, Before: &p.cursors[i]})
			if err != nil {
				yield(Page{}, err)
				return
			}
			if !yield(page, nil) {
				return
			}
		}
		yield(p.newest, nil)
	}
}
