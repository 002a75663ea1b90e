package api

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// export streams a whole conversation oldest message first, as JSON lines
// (one message object a line) or as markdown.
//
// Pages are read newest first, so oldest-first output takes two walks in
// bounded memory: the first keeps only the newest page and the cursor of
// every older page, the second reads the older pages again, oldest first,
// and writes each before the kept newest page closes the export. The
// export is the conversation as the first walk found it: messages that
// arrive during it are left to the next export.
func (s *server) export(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	ctx := r.Context()
	q := r.URL.Query()
	room := r.PathValue("room_id")
	if !journal.ValidRoomID(room) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "room_id is not a room ID")
		return
	}
	thread, ok := threadParam(w, q.Get("thread"))
	if !ok {
		return
	}
	write, contentType, err := ExportFormat(q.Get("format"))
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	reader := a.reader()
	plan, err := journal.PlanExport(ctx, reader, room, thread, s.exportPage, nil)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	for page, err := range plan.Pages(ctx, reader, room, thread, s.exportPage) {
		if err != nil {
			s.abort(name, err, r)
		}
		if write(bw, page) != nil || bw.Flush() != nil {
			return // the client went away: nothing to tell it
		}
	}
}

// ExportFormat returns the writer of one export page in format ("" or
// jsonl: one JSON message per line; markdown: for people) and its content
// type. The daemon's export route and an offline export write the same
// bytes through it.
func ExportFormat(format string) (write func(io.Writer, journal.Page) error, contentType string, err error) {
	switch format {
	case "", "jsonl":
		return writeJSONLines, "application/x-ndjson", nil
	case "markdown":
		return writeMarkdown, "text/markdown; charset=utf-8", nil
	}
	return nil, "", errors.New("format must be jsonl or markdown")
}

// abort ends a response whose status is already sent: the connection is
// cut, so the client sees a truncated export rather than a complete one.
func (s *server) abort(agent string, err error, r *http.Request) {
	if r.Context().Err() == nil {
		s.log.Error().Err(err).Str("agent", agent).Str("path", r.URL.Path).Msg("Export failed midway; response cut")
	}
	panic(http.ErrAbortHandler)
}

// owedLine reports messages an export page omitted because their visible
// revision must be fetched again.
type owedLine struct {
	OwedRefetch []string `json:"owed_refetch"`
}

// prunedLine reports that retention removed the messages before the
// export's oldest.
type prunedLine struct {
	PrunedBefore int64 `json:"pruned_before"`
}

func writeJSONLines(bw io.Writer, page journal.Page) error {
	enc := json.NewEncoder(bw)
	for _, m := range page.Messages {
		if err := enc.Encode(toMessage(m)); err != nil {
			return err
		}
	}
	if len(page.OwedRefetch) > 0 {
		if err := enc.Encode(owedLine{OwedRefetch: page.OwedRefetch}); err != nil {
			return err
		}
	}
	if page.PrunedBefore > 0 {
		return enc.Encode(prunedLine{PrunedBefore: page.PrunedBefore})
	}
	return nil
}

func writeMarkdown(bw io.Writer, page journal.Page) error {
	for _, m := range page.Messages {
		var c struct {
			MsgType string `json:"msgtype"`
			Body    string `json:"body"`
		}
		_ = json.Unmarshal(m.Content, &c) // content that is not a message shows as its type below
		body := c.Body
		if body == "" {
			body = fmt.Sprintf("_(%s without text)_", orDefault(c.MsgType, "event"))
		}
		ts := time.UnixMilli(m.CreatedTS).UTC().Format("2006-01-02 15:04:05")
		if _, err := fmt.Fprintf(bw, "**%s** · %s UTC\n\n%s\n\n", m.Sender, ts, body); err != nil {
			return err
		}
	}
	if n := len(page.OwedRefetch); n > 0 {
		if _, err := fmt.Fprintf(bw, "_(%d messages omitted: they must be fetched again)_\n\n", n); err != nil {
			return err
		}
	}
	if page.PrunedBefore > 0 {
		ts := time.UnixMilli(page.PrunedBefore).UTC().Format("2006-01-02 15:04:05")
		_, err := fmt.Fprintf(bw, "_(messages up to %s UTC were removed by retention)_\n\n", ts)
		return err
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
