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
