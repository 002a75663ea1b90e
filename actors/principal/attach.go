package principal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// uploader is a Transport that can upload a file for a message into a
// room, encrypted there when the room is (*matrix.Client).
type uploader interface {
	UploadFor(ctx context.Context, room, contentType, filename string, body io.Reader, size int64) (journal.Attachment, error)
}

// unsendable is why an attachment can never be sent as it is: retrying
// the turn would fail the same way, so the answer says so instead.
type unsendable struct {
	// reason is what the room is told, after "could not be sent: ".
	reason string
	err    error
}

func (u *unsendable) Error() string { return u.reason + ": " + u.err.Error() }
func (u *unsendable) Unwrap() error { return u.err }

// attachment uploads the file of a reply and returns the content of the
// message carrying it, with its caption. The upload comes before the turn
// is recorded: a crash in between asks the agent again and leaves at most
// a file no message names on the homeserver, never a second message.
//
// A file that can never be sent (missing, unreadable, not a regular file,
// larger than MaxUpload, refused by the homeserver for what it is) is
// answered with a notice saying so, after the caption if there is one:
// a retry would fail the same way, and asking the agent again after each
// backoff would cost as much each time and leave the person without an
// answer. A failure that may pass (the homeserver unreachable, a 5xx, a
// 429) is the turn's error, and the event is offered again.
func (a *principalActor) attachment(ctx context.Context, e journal.PendingEvent, f *agent.File) (json.RawMessage, error) {
	name := f.Name
	if name == "" {
		name = filepath.Base(f.Path)
	}
	content, err := a.upload(ctx, e.RoomID, f, name)
	var u *unsendable
	if !errors.As(err, &u) {
		return content, err
	}
	a.log.Warn().Err(err).Str("event_id", e.EventID).Str("path", f.Path).
		Msg("The agent's attachment cannot be sent; a notice says so instead")
	body := fmt.Sprintf("(The attachment %s could not be sent: %s.)", name, u.reason)
	if f.Caption != "" {
		body = f.Caption + "\n\n" + body
	}
	return json.Marshal(map[string]string{"msgtype": "m.notice", "body": body})
}

// upload reads the file, uploads it and returns its message's content.
func (a *principalActor) upload(ctx context.Context, room string, f *agent.File, name string) (json.RawMessage, error) {
	up, ok := a.deps.Transport.(uploader)
	if !ok {
		return nil, &unsendable{reason: "this daemon cannot upload files", err: errors.New("the transport has no upload")}
	}
	limit := a.deps.withTurnDefaults().MaxUpload
	data, err := readFile(f.Path, limit)
	if err != nil {
		return nil, err
	}
	mimeType := f.MimeType
	if mimeType == "" {
		mimeType = http.DetectContentType(data)
	}
	att, err := up.UploadFor(ctx, room, mimeType, name, bytes.NewReader(data), int64(len(data)))
	var refused *matrix.HTTPError
	switch {
	case err == nil:
	case errors.As(err, &refused) && refused.Status >= 400 && refused.Status < 500 &&
		refused.Status != http.StatusTooManyRequests && !errors.Is(err, matrix.ErrInvalidToken):
		// Refused for what it is (too large, a type the server will not
		// take, uploads forbidden): sent again, it would be refused again.
		// A refused token is not the file's fault: the client has signed in
		// again, and the retry may well go through.
		return nil, &unsendable{reason: "the homeserver refused it", err: err}
	default:
		return nil, fmt.Errorf("upload attachment: %w", err)
	}
	return journal.AttachmentContent(att, f.Caption)
}

// readFile reads the regular file at path, refusing one larger than limit.
// A path that is not a regular file is refused before it is read: a FIFO
// or a device would block the turn, or never end.
func readFile(path string, limit int64) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, &unsendable{reason: "it could not be read", err: err}
	}
	defer file.Close()
	st, err := file.Stat()
	switch {
	case err != nil:
		return nil, &unsendable{reason: "it could not be read", err: err}
	case !st.Mode().IsRegular():
		return nil, &unsendable{reason: "it is not a file", err: fmt.Errorf("%s is %s", path, st.Mode().Type())}
	case st.Size() > limit:
		return nil, tooLarge(st.Size(), limit)
	}
	// Read up to the cap and a byte past it: the file may have grown since.
	data, err := io.ReadAll(io.LimitReader(file, limit+1))
	switch {
	case err != nil:
		return nil, &unsendable{reason: "it could not be read", err: err}
	case int64(len(data)) > limit:
		return nil, tooLarge(int64(len(data)), limit)
	}
	return data, nil
}

// tooLarge is a file of size bytes, over limit.
func tooLarge(size, limit int64) error {
	return &unsendable{reason: "it is larger than " + byteSize(limit),
		err: fmt.Errorf("%d bytes, over the cap of %d", size, limit)}
}

// byteSize writes n bytes as people read a size: in MiB or KiB when whole.
func byteSize(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
