package matrix

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"maunium.net/go/mautrix/crypto/attachment"

	"github.com/mindroomd/mindroomd/journal"
)

// UploadFor uploads a file of size bytes for a message into room and
// returns the attachment as that message carries it. In a room the
// client's Encrypter encrypts, the file is encrypted before it leaves (AES
// in CTR mode under a fresh key, as Matrix clients do) and the message
// carries the key in its file object: the homeserver never holds the file
// in the clear, as it never holds the message in the clear. The file is
// then read whole, so size bounds the memory it takes.
func (c *Client) UploadFor(ctx context.Context, room, contentType, filename string, body io.Reader, size int64) (journal.Attachment, error) {
	att := journal.Attachment{Name: filename, MimeType: contentType, Size: size}
	encrypted := false
	if c.encrypter != nil {
		var err error
		if encrypted, err = c.encrypter.Encrypts(ctx, room); err != nil {
			return att, fmt.Errorf("upload for %s: %w", room, err)
		}
	}
	if !encrypted {
		url, err := c.Upload(ctx, contentType, filename, body, size)
		att.URL = url
		return att, err
	}
	data, err := io.ReadAll(io.LimitReader(body, size+1))
	if err != nil {
		return att, fmt.Errorf("upload for %s: read the file: %w", room, err)
	}
	if int64(len(data)) != size {
		return att, fmt.Errorf("upload for %s: the file has %d bytes, not %d", room, len(data), size)
	}
	key := attachment.NewEncryptedFile()
	key.EncryptInPlace(data)
	if att.File, err = json.Marshal(key); err != nil {
		return att, fmt.Errorf("upload for %s: %w", room, err)
	}
	// The name and type stay in the encrypted message; the homeserver
	// sees an anonymous blob.
	att.URL, err = c.Upload(ctx, "application/octet-stream", "", bytes.NewReader(data), size)
	return att, err
}
