package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"mime"
	"net/url"
	"strings"

	mxattachment "maunium.net/go/mautrix/crypto/attachment"
)

// mediaPath is the path, relative to an agent's routes, that serves the
// file at mxc in the clear, and whether the file is encrypted. An
// encrypted file's path carries its key (the `file` parameter, the
// message's file object without its URL, base64url) and its type: the
// agent reads both in the message anyway, and the API needs them to
// decrypt.
func mediaPath(content []byte, mxc string, info json.RawMessage) (string, bool) {
	path := "media/" + strings.TrimPrefix(mxc, "mxc://")
	var c struct {
		File json.RawMessage `json:"file"`
	}
	if json.Unmarshal(content, &c) != nil || len(c.File) == 0 {
		return path, false
	}
	var file map[string]json.RawMessage
	if json.Unmarshal(c.File, &file) != nil {
		return path, false
	}
	delete(file, "url")
	key, _ := json.Marshal(file)
	q := url.Values{"file": {base64.RawURLEncoding.EncodeToString(key)}}
	var i struct {
		Mimetype string `json:"mimetype"`
	}
	if json.Unmarshal(info, &i) == nil && i.Mimetype != "" {
		q.Set("type", i.Mimetype)
	}
	return path + "?" + q.Encode(), true
}

// errBadFileKey refuses a file parameter that is not an encrypted file's
// key.
var errBadFileKey = errors.New("file must be an encrypted file's key (base64url JSON of the message's file object)")

// fileKey reads the file parameter of an encrypted file's path; nil when
// the path has none.
func fileKey(q url.Values) (*mxattachment.EncryptedFile, string, error) {
	v := q.Get("file")
	if v == "" {
		return nil, "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return nil, "", errBadFileKey
	}
	var ef mxattachment.EncryptedFile
	if err := json.Unmarshal(raw, &ef); err != nil || ef.PrepareForDecryption() != nil {
		return nil, "", errBadFileKey
	}
	ctype := q.Get("type")
	if mt, _, err := mime.ParseMediaType(ctype); err != nil || mt == "" {
		ctype = ""
	}
	return &ef, ctype, nil
}
