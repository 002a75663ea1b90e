package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// uploadHold stands in front of the homeserver and, once armed, passes
// the next upload on and holds its answer until the caller goes away: the
// homeserver has the file, and the daemon never learns its URL.
type uploadHold struct {
	URL      string
	armed    atomic.Bool
	uploaded chan struct{}
}

func startUploadHold(t *testing.T, homeserver string) *uploadHold {
	t.Helper()
	target, err := url.Parse(homeserver)
	if err != nil {
		t.Fatal(err)
	}
	h := &uploadHold{uploaded: make(chan struct{}, 1)}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
		ModifyResponse: func(resp *http.Response) error {
			r := resp.Request
			if r.Method != http.MethodPost || !strings.Contains(r.URL.Path, "/media/") ||
				!strings.HasSuffix(r.URL.Path, "/upload") || !h.armed.CompareAndSwap(true, false) {
				return nil
			}
			h.uploaded <- struct{}{}
			<-r.Context().Done()
			return r.Context().Err()
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) },
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	h.URL = srv.URL
	return h
}

// A keyed send with a file, its daemon killed after the homeserver stored
// the file and before the daemon learned its URL, is posted again after
// the restart: the file is uploaded again (the first copy is an orphan on
// the homeserver), and the room shows the message once.
func TestASendWhoseUploadACrashCutShowsOneMessage(t *testing.T) {
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	hs := dendrite.Start(t)
	bot := hs.Register(t, "uploader", "uploader-password-7c2e")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	door := startUploadHold(t, hs.URL)
	const token = "api-token-of-the-uploading-agent"
	cfg := writeHTTPAgentConfig(t, door.URL, bot, "uploader", token)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	daemon := startDaemonProcess(t, bin, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", daemon.log)
		}
	})
	base := "http://" + daemonAddress(t, daemon.log) + "/v1/agents/uploader"
	awaitPending(t, base, token, alice.SendText(room, "send me the chart"))

	chart := noisePNG(t, 64, 64, 7)
	key := http.Header{"Idempotency-Key": {"chart-1"}}
	const message = `{"body":"the chart"}`
	post := func(ctx context.Context) (int, []byte) {
		return postMultipart(t, ctx, base+"/rooms/"+url.PathEscape(room)+"/send", token, key, message, "chart.png",
			"image/png", chart)
	}
	door.armed.Store(true)
	// The first request's answer never comes: the daemon dies under it.
	first, err := multipartRequest(ctx, base+"/rooms/"+url.PathEscape(room)+"/send", key, message, "chart.png",
		"image/png", chart)
	if err != nil {
		t.Fatal(err)
	}
	first.Header.Set("Authorization", "Bearer "+token)
	go func() {
		if resp, err := http.DefaultClient.Do(first); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-door.uploaded:
	case <-ctx.Done():
		t.Fatal("the upload never reached the homeserver")
	}
	daemon.kill(t)
	daemon = startDaemonProcess(t, bin, cfg)
	base = "http://" + daemonAddress(t, daemon.log) + "/v1/agents/uploader"
	code, raw := post(ctx)
	var d apiDelivery
	if err := json.Unmarshal(raw, &d); err != nil || code != http.StatusOK || d.Outcome != "created" {
		t.Fatalf("the send after the restart = %d %s, want created: the first never committed", code, raw)
	}
	d = awaitAcknowledged(t, "the chart", func() apiDelivery {
		code, raw := post(ctx)
		var d apiDelivery
		if err := json.Unmarshal(raw, &d); err != nil || code != http.StatusOK || d.Outcome != "replayed" {
			t.Fatalf("the same send again = %d %s, want replayed", code, raw)
		}
		return d
	})
	daemon.stop(t)
	images := 0
	for _, e := range surfaceHistory(t, alice, room) {
		if e.Sender == bot.UserID && e.Content.Msgtype == "m.image" {
			images++
		}
	}
	if images != 1 {
		t.Fatalf("the room shows the chart %d times, want once", images)
	}
}
