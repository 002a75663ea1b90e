package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/mindroomd/mindroomd/journal"
)

// DefaultMaxMedia caps a file downloaded or uploaded through the API when
// Deps gives no cap.
const DefaultMaxMedia = 20 << 20

// upload is a file a request carries, spooled to disk so the homeserver is
// told its size before a byte is sent and memory holds none of it.
type upload struct {
	path     string
	name     string
	mimeType string
	size     int64
}

// remove deletes the spooled copy.
func (u *upload) remove() {
	if u != nil {
		_ = os.Remove(u.path)
	}
}

// multipartRequest reports whether r carries its request as
// multipart/form-data: a JSON part named "message" and a file part named
// "file".
func multipartRequest(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == "multipart/form-data"
}

// readForm reads a multipart request: the "message" part (a JSON object of
// at most MaxReplyBytes, decoded into v as a JSON body is) and the "file"
// part, spooled to a temporary file of at most maxFile bytes. Any other
// part is refused. On false the answer is written and nothing is left on
// disk.
func readForm(w http.ResponseWriter, r *http.Request, maxFile int64, v any) (*upload, bool) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFile+MaxReplyBytes+64<<10)
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, "the multipart body cannot be read: "+err.Error())
		return nil, false
	}
	var (
		file    *upload
		message bool
	)
	fail := func(status int, code, msg string) (*upload, bool) {
		file.remove()
		writeError(w, status, code, msg)
		return nil, false
	}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return fail(http.StatusRequestEntityTooLarge, codeTooLarge, "the request body is larger than the media cap")
		}
		if err != nil {
			return fail(http.StatusBadRequest, codeBadRequest, "the multipart body cannot be read: "+err.Error())
		}
		switch part.FormName() {
		case "message":
			if message {
				return fail(http.StatusBadRequest, codeBadRequest, "the message part comes once")
			}
			message = true
			raw, err := io.ReadAll(io.LimitReader(part, MaxReplyBytes+1))
			switch {
			case errors.As(err, &tooLarge):
				return fail(http.StatusRequestEntityTooLarge, codeTooLarge, "the request body is larger than the media cap")
			case err != nil:
				return fail(http.StatusBadRequest, codeBadRequest, "the message part cannot be read: "+err.Error())
			case len(raw) > MaxReplyBytes:
				return fail(http.StatusRequestEntityTooLarge, codeTooLarge, "the message part is larger than 64 KiB")
			}
			if err := decodeStrict(bytes.NewReader(raw), v); err != nil {
				return fail(http.StatusBadRequest, codeBadRequest, "the message part must be one JSON object: "+err.Error())
			}
		case "file":
			if file != nil {
				return fail(http.StatusBadRequest, codeBadRequest, "one file per message")
			}
			u, status, msg := spool(part, maxFile)
			if u == nil {
				return fail(status, codeFor(status), msg)
			}
			file = u
		default:
			return fail(http.StatusBadRequest, codeBadRequest, "unknown part "+quote(part.FormName())+": want message and file")
		}
	}
	if file == nil {
		return fail(http.StatusBadRequest, codeBadRequest, "a multipart request needs a file part")
	}
	return file, true
}

func codeFor(status int) string {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return codeTooLarge
	case http.StatusBadRequest:
		return codeBadRequest
	}
	return codeInternal
}

// spool copies a file part to a temporary file, refusing one past maxFile.
func spool(part *multipart.Part, maxFile int64) (*upload, int, string) {
	name, ctype := "", part.Header.Get("Content-Type")
	if fn := part.FileName(); fn != "" {
		name = filepath.Base(fn)
	}
	f, err := os.CreateTemp("", "mindroomd-upload-*")
	if err != nil {
		return nil, http.StatusInternalServerError, "internal error"
	}
	u := &upload{path: f.Name(), name: name}
	n, err := io.Copy(f, io.LimitReader(part, maxFile+1))
	cerr := f.Close()
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge), err == nil && n > maxFile:
		u.remove()
		return nil, http.StatusRequestEntityTooLarge, "the file is larger than the media cap"
	case err != nil || cerr != nil:
		u.remove()
		return nil, http.StatusBadRequest, "the file part cannot be read"
	case n == 0:
		u.remove()
		return nil, http.StatusBadRequest, "the file is empty"
	}
	u.size = n
	if mt, _, err := mime.ParseMediaType(ctype); err == nil && mt != "application/octet-stream" {
		u.mimeType = mt
	} else {
		u.mimeType = sniff(u.path)
	}
	if u.name == "" || u.name == "." || u.name == string(filepath.Separator) {
		u.name = "file"
	}
	return u, 0, ""
}

// sniff guesses a spooled file's type from its first bytes.
func sniff(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "application/octet-stream"
	}
	defer f.Close()
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	mt, _, _ := mime.ParseMediaType(http.DetectContentType(head[:n]))
	return mt
}

// attachmentContent is the content of a message carrying u, uploaded as
// att (the zero Attachment for the comparison with an earlier send of the
// same request, made before any upload).
func attachmentContent(u *upload, att journal.Attachment, caption string) (json.RawMessage, error) {
	if att.URL == "" {
		att.URL = "mxc://pending/upload"
	}
	att.Name, att.MimeType, att.Size = u.name, u.mimeType, u.size
	return journal.AttachmentContent(att, caption)
}

// sameButURL compares two message contents as sameJSON does, except where
// the file went (its URL, and its key when it was encrypted): a request
// sent again uploads nothing and is compared with what the first one
// sent.
func sameButURL(recorded, fresh json.RawMessage) (bool, error) {
	strip := func(b json.RawMessage) (json.RawMessage, error) {
		var c map[string]json.RawMessage
		if err := json.Unmarshal(b, &c); err != nil {
			return nil, err
		}
		delete(c, "url")
		delete(c, "file")
		return json.Marshal(c)
	}
	a, err := strip(recorded)
	if err != nil {
		return false, err
	}
	b, err := strip(fresh)
	if err != nil {
		return false, err
	}
	return sameJSON(a, b)
}

// decodeStrict decodes one JSON object from rd into v: unknown fields and
// anything but white space after the object are refused.
func decodeStrict(rd io.Reader, v any) error {
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	var syntax *json.SyntaxError
	switch _, err := dec.Token(); {
	case errors.Is(err, io.EOF):
		return nil
	case err == nil, errors.As(err, &syntax):
		return errors.New("trailing data after the JSON object")
	default:
		return err
	}
}

// quote bounds and quotes a caller's name for an error message.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
}

// openUpload opens the spooled file for the homeserver.
func (u *upload) open() (*os.File, error) { return os.Open(u.path) }
