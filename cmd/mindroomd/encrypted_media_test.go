package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	mxattachment "maunium.net/go/mautrix/crypto/attachment"
)

// A file an agent sends into an encrypted room is encrypted before it
// leaves: the homeserver holds only ciphertext, the person's client finds
// the key in the (encrypted) message and reads the very bytes, and the
// agent reads it back in the clear through the path its page shows.
func TestAFileSentIntoAnEncryptedRoomNeverReachesTheHomeserverInTheClear(t *testing.T) {
	e := startEncrypted(t, "sealer")
	// The daemon counts the room as joined once its own sync admits the
	// join, which can come after alice's client shows it: an answer in
	// the room says it has.
	e.ask("Are you in?")
	base := "http://" + daemonAddress(t, e.d.log) + "/v1/agents/sealer"
	chart := noisePNG(t, 48, 48, 11)
	code, raw := postMultipart(t, e.ctx, base+"/rooms/"+url.PathEscape(e.room)+"/send", e.token,
		http.Header{"Idempotency-Key": {"sealed-chart"}}, `{"body":"the sealed chart"}`, "chart.png", "image/png", chart)
	if code != http.StatusOK {
		t.Fatalf("the send = %d %s", code, raw)
	}
	_, content := e.alice.AwaitDecrypted(e.ctx, e.room, func(evType string, c map[string]any, _ json.RawMessage) bool {
		return evType == "m.room.message" && c["msgtype"] == "m.image"
	})
	if _, clear := content["url"]; clear {
		t.Fatalf("the image message names a file in the clear: %v", content)
	}
	fileJSON, err := json.Marshal(content["file"])
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		URL string `json:"url"`
		mxattachment.EncryptedFile
	}
	if err := json.Unmarshal(fileJSON, &file); err != nil || !strings.HasPrefix(file.URL, "mxc://") {
		t.Fatalf("the message's file = %s (%v), want an encrypted file's key and URL", fileJSON, err)
	}
	media := base + "/media/" + strings.TrimPrefix(file.URL, "mxc://")
	held := apiGet(t, e, media)
	if bytes.Equal(held, chart) || len(held) != len(chart) {
		t.Fatalf("the homeserver holds %d bytes, equal to the file: %v; want its ciphertext", len(held), bytes.Equal(held, chart))
	}
	if err := file.EncryptedFile.DecryptInPlace(held); err != nil || !bytes.Equal(held, chart) {
		t.Fatalf("the person's key does not open the file: %v", err)
	}
	var page struct {
		Messages []struct {
			Attachment *struct {
				Encrypted bool   `json:"encrypted"`
				Path      string `json:"path"`
			} `json:"attachment"`
		} `json:"messages"`
	}
	if code := apiCall(t, http.MethodGet, base+"/rooms/"+url.PathEscape(e.room)+"/messages?limit=5", e.token, "", &page); code != http.StatusOK {
		t.Fatalf("the page = %d", code)
	}
	var path string
	for _, m := range page.Messages {
		if m.Attachment != nil && m.Attachment.Encrypted {
			path = m.Attachment.Path
		}
	}
	if path == "" {
		t.Fatalf("the agent's page shows no encrypted file: %+v", page)
	}
	if got := apiGet(t, e, base+"/"+path); !bytes.Equal(got, chart) {
		t.Fatal("the agent's own path to the file does not give its bytes in the clear")
	}
}

// apiGet GETs url with the agent's token and returns the body of a 200.
func apiGet(t *testing.T, e *encrypted, url string) []byte {
	t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	code, _, body := surfaceDo(t, req, e.token)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d %s", url, code, body)
	}
	return body
}
