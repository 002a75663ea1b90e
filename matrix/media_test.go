package matrix_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// splitMXC splits an mxc URI the test was handed.
func splitMXC(t *testing.T, uri string) (server, mediaID string) {
	t.Helper()
	rest, ok := strings.CutPrefix(uri, "mxc://")
	server, mediaID, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 {
		t.Fatalf("%q is not an mxc URI", uri)
	}
	return server, mediaID
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// personUpload has the person upload data from a client of their own and
// returns the mxc URI.
func personUpload(t *testing.T, acct dendrite.Account, contentType, filename string, data []byte) string {
	t.Helper()
	cfg := config(t, acct)
	cfg.Agent = "person"
	uri, err := login(t, cfg).Upload(t.Context(), contentType, filename, bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	return uri
}

func readAll(t *testing.T, m *matrix.Media) []byte {
	t.Helper()
	defer m.Body.Close()
	data, err := io.ReadAll(m.Body)
	if err != nil {
		t.Fatalf("read the download: %v", err)
	}
	return data
}

// roundTripper is a function as an http.RoundTripper.
type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestAPersonsUploadDownloadsByteIdentical(t *testing.T) {
	s := newSurface(t)
	data := randomBytes(t, 300<<10)
	uri := personUpload(t, s.personAcct, "image/png", "cat picture.png", data)
	server, mediaID := splitMXC(t, uri)
	if server != dendrite.ServerName {
		t.Errorf("uploaded to %s, want the homeserver %s", server, dendrite.ServerName)
	}

	// Dendrite v0.13.8 serves the authenticated media API: the download
	// takes one request there, no fallback.
	var paths []string
	cfg := config(t, register(t))
	cfg.HTTPClient = &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		paths = append(paths, r.URL.EscapedPath())
		return http.DefaultTransport.RoundTrip(r)
	})}
	bot := login(t, cfg)
	paths = nil

	m, err := bot.Download(t.Context(), server, mediaID, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if want := "/_matrix/client/v1/media/download/" + server + "/" + mediaID; len(paths) != 1 || paths[0] != want {
		t.Errorf("requests %q, want only %s", paths, want)
	}
	if got := readAll(t, m); !bytes.Equal(got, data) {
		t.Errorf("downloaded %d bytes, not the %d uploaded", len(got), len(data))
	}
	if m.ContentType != "image/png" || m.Length != int64(len(data)) || m.Filename != "cat picture.png" {
		t.Errorf("media %q, length %d, filename %q; want image/png, %d, %q", m.ContentType, m.Length, m.Filename, len(data), "cat picture.png")
	}
}

// A file the server says is larger than the cap is refused before a byte
// of it is read.
func TestADownloadOverTheCapIsTooLarge(t *testing.T) {
	s := newSurface(t)
	data := randomBytes(t, 4096)
	server, mediaID := splitMXC(t, personUpload(t, s.personAcct, "application/octet-stream", "", data))
	m, err := s.bot.Download(t.Context(), server, mediaID, int64(len(data))-1)
	if !errors.Is(err, matrix.ErrMediaTooLarge) {
		t.Fatalf("download over the cap = %+v, %v; want ErrMediaTooLarge", m, err)
	}
}

func TestAMissingFileIsTheServersNotFound(t *testing.T) {
	s := newSurface(t)
	_, err := s.bot.Download(t.Context(), dendrite.ServerName, "nosuchfile", 1<<20)
	var he *matrix.HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusNotFound || he.ErrCode != "M_NOT_FOUND" {
		t.Fatalf("download of a missing file: %v, want an HTTPError 404 M_NOT_FOUND", err)
	}
}

// A refused token is logged in again: a download, which changes nothing,
// is asked once more; an upload, whose body cannot be sent twice, fails,
// and the next one goes through.
func TestARefusedTokenLogsInAgainForMedia(t *testing.T) {
	s := newSurface(t)
	acct := register(t)
	cfg := config(t, acct)
	c := login(t, cfg)
	data := randomBytes(t, 1000)
	server, mediaID := splitMXC(t, personUpload(t, s.personAcct, "text/plain", "a.txt", data))

	_, _, token := storedSession(t, cfg)
	logout(t, token)
	m, err := c.Download(t.Context(), server, mediaID, 1<<20)
	if err != nil {
		t.Fatalf("download after the token was revoked: %v", err)
	}
	if got := readAll(t, m); !bytes.Equal(got, data) || c.Session() != 1 {
		t.Errorf("after a re-login: %d bytes, session %d; want the %d uploaded, session 1", len(got), c.Session(), len(data))
	}

	_, _, token = storedSession(t, cfg)
	logout(t, token)
	if _, err := c.Upload(t.Context(), "text/plain", "", bytes.NewReader(data), int64(len(data))); !errors.Is(err, matrix.ErrInvalidToken) {
		t.Fatalf("upload under a revoked token: %v, want ErrInvalidToken", err)
	} else if strings.Contains(err.Error(), token) {
		t.Errorf("the error shows the token: %v", err)
	}
	uri, err := c.Upload(t.Context(), "text/plain", "", bytes.NewReader(data), int64(len(data)))
	if err != nil || c.Session() != 2 {
		t.Fatalf("the upload after: %s, %v (session %d); want it through on session 2", uri, err, c.Session())
	}
}

// fakeMedia is a homeserver answering whoami and password logins for
// @bot:fake (token-1 first, then token-2, token-3 ...), and any other
// request with media. Its client logs in with token-1.
type fakeMedia struct {
	mu       sync.Mutex
	logins   int
	requests []string // method, path and Authorization of each media request
	media    http.HandlerFunc
}

func newFakeMedia(t *testing.T, media http.HandlerFunc) (*fakeMedia, *matrix.Client) {
	t.Helper()
	f := &fakeMedia{media: media}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/_matrix/client/v3/account/whoami":
			_, _ = w.Write([]byte(`{"user_id":"@bot:fake","device_id":"DEV"}`))
		case "/_matrix/client/v3/login":
			f.mu.Lock()
			f.logins++
			token := "token-" + strconv.Itoa(1+f.logins)
			f.mu.Unlock()
			_, _ = w.Write([]byte(`{"user_id":"@bot:fake","device_id":"DEV","access_token":"` + token + `"}`))
		default:
			f.mu.Lock()
			f.requests = append(f.requests, r.Method+" "+r.URL.EscapedPath()+" "+r.Header.Get("Authorization"))
			f.mu.Unlock()
			f.media(w, r)
		}
	}))
	t.Cleanup(s.Close)
	c := login(t, matrix.Config{Homeserver: s.URL, UserID: "@bot:fake", AccessToken: "token-1", Password: "pw",
		Agent: "bot", StorageDir: t.TempDir(), Log: zerolog.New(zerolog.NewTestWriter(t))})
	return f, c
}

func (f *fakeMedia) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// countingClient is a client of a fake server that counts the requests it
// gets beyond the login.
func countingClient(t *testing.T) (*matrix.Client, func() int) {
	t.Helper()
	f, c := newFakeMedia(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	return c, func() int { return len(f.seen()) }
}

const (
	authedPath = "/_matrix/client/v1/media/download/fake/abc"
	legacyPath = "/_matrix/media/v3/download/fake/abc"
)

// A server without the authenticated media API (before Matrix 1.11) is
// asked at the legacy endpoint; one that has it but not the file is not.
func TestADownloadFallsBackToTheLegacyEndpointOnlyWhereTheServerLacksTheNewOne(t *testing.T) {
	for name, tc := range map[string]struct {
		status   int
		body     string
		fallback bool
	}{
		"404Unrecognized": {404, `{"errcode":"M_UNRECOGNIZED","error":"Unrecognized request"}`, true},
		"405":             {405, ``, true},
		"400Unrecognized": {400, `{"errcode":"M_UNRECOGNIZED"}`, true},
		"404NotFound":     {404, `{"errcode":"M_NOT_FOUND"}`, false},
		"403Forbidden":    {403, `{"errcode":"M_FORBIDDEN"}`, false},
	} {
		t.Run(name, func(t *testing.T) {
			f, c := newFakeMedia(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == authedPath {
					w.WriteHeader(tc.status)
					_, _ = w.Write([]byte(tc.body))
					return
				}
				w.Header().Set("Content-Type", "text/plain")
				_, _ = w.Write([]byte("legacy"))
			})
			m, err := c.Download(t.Context(), "fake", "abc", 100)
			want := []string{"GET " + authedPath + " Bearer token-1"}
			if tc.fallback {
				want = append(want, "GET "+legacyPath+" Bearer token-1")
				if err != nil {
					t.Fatal(err)
				}
				if got := readAll(t, m); string(got) != "legacy" {
					t.Errorf("downloaded %q, want the legacy endpoint's %q", got, "legacy")
				}
			} else {
				var he *matrix.HTTPError
				if !errors.As(err, &he) || he.Status != tc.status {
					t.Errorf("download: %v, want the HTTPError %d", err, tc.status)
				}
			}
			if got := f.seen(); strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// Without a Content-Length, the cap is enforced as the body is read: the
// reader yields the cap's worth, then fails.
func TestADownloadWithoutALengthFailsOnceItPassesTheCap(t *testing.T) {
	data := randomBytes(t, 10000)
	_, c := newFakeMedia(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename*=utf-8''r%C3%A9sum%C3%A9.pdf`)
		for chunk := range slices.Chunk(data, 1000) {
			_, _ = w.Write(chunk)
			w.(http.Flusher).Flush() // chunked: no Content-Length
		}
	})
	for _, limit := range []int64{10000, 20000} {
		m, err := c.Download(t.Context(), "fake", "abc", limit)
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, m); !bytes.Equal(got, data) || m.Length != -1 || m.Filename != "résumé.pdf" {
			t.Errorf("cap %d: %d bytes, length %d, filename %q; want all %d, -1, %q", limit, len(got), m.Length, m.Filename, len(data), "résumé.pdf")
		}
	}
	m, err := c.Download(t.Context(), "fake", "abc", 9999)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Body.Close()
	got, err := io.ReadAll(m.Body)
	if !errors.Is(err, matrix.ErrMediaTooLarge) || len(got) > 9999 {
		t.Errorf("cap 9999: read %d bytes, %v; want at most 9999 and ErrMediaTooLarge", len(got), err)
	}
}

// A token refused mid-run is replaced and the download asked once more,
// with the new token; a second refusal is the caller's.
func TestADownloadRetriesOnceWithANewToken(t *testing.T) {
	var refusals atomic.Int64
	refusals.Store(1)
	f, c := newFakeMedia(t, func(w http.ResponseWriter, r *http.Request) {
		if refusals.Add(-1) >= 0 {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"errcode":"M_UNKNOWN_TOKEN"}`))
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	m, err := c.Download(t.Context(), "fake", "abc", 100)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, m); string(got) != "ok" {
		t.Errorf("downloaded %q", got)
	}
	want := "GET " + authedPath + " Bearer token-1\nGET " + authedPath + " Bearer token-2"
	if got := strings.Join(f.seen(), "\n"); got != want {
		t.Errorf("requests:\n%s\nwant:\n%s", got, want)
	}

	refusals.Store(2)
	_, err = c.Download(t.Context(), "fake", "abc", 100)
	if !errors.Is(err, matrix.ErrInvalidToken) {
		t.Fatalf("download refused twice: %v, want ErrInvalidToken", err)
	}
	if strings.Contains(err.Error(), "token-") {
		t.Errorf("the error shows a token: %v", err)
	}
}

func TestAnUploadAnswerThatIsNoMXCURIIsAnError(t *testing.T) {
	for _, answer := range []string{`{"content_uri":"https://fake/abc"}`, `{"content_uri":"mxc://fake/../x"}`, `{}`, `not json`} {
		f, c := newFakeMedia(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(answer)) })
		if uri, err := c.Upload(t.Context(), "", "", strings.NewReader("x"), 1); err == nil {
			t.Errorf("answer %s: uploaded as %q, want an error", answer, uri)
		}
		if got := f.seen(); len(got) != 1 || got[0] != "POST /_matrix/media/v3/upload Bearer token-1" {
			t.Errorf("requests %q", got)
		}
	}
}

func TestUploadSendsTheBodyWithItsTypeLengthAndName(t *testing.T) {
	var got struct {
		contentType, filename string
		length                int64
		body                  []byte
	}
	_, c := newFakeMedia(t, func(w http.ResponseWriter, r *http.Request) {
		got.contentType, got.filename, got.length = r.Header.Get("Content-Type"), r.URL.Query().Get("filename"), r.ContentLength
		got.body, _ = io.ReadAll(r.Body)
		_, _ = w.Write([]byte(`{"content_uri":"mxc://fake/abc"}`))
	})
	uri, err := c.Upload(t.Context(), "text/plain; charset=utf-8", "notes & plans.txt", strings.NewReader("hello"), 5)
	if err != nil || uri != "mxc://fake/abc" {
		t.Fatalf("upload = %q, %v", uri, err)
	}
	if got.contentType != "text/plain; charset=utf-8" || got.filename != "notes & plans.txt" || got.length != 5 || string(got.body) != "hello" {
		t.Errorf("the server got %+v", got)
	}
}

// A server name or media ID that is not one is refused before any request:
// both become segments of the request's path.
func TestBadMediaIDsAreRefusedWithoutARequest(t *testing.T) {
	c, requests := countingClient(t)
	for _, tc := range []struct{ server, mediaID string }{
		{"", "abc"},
		{"fake", ""},
		{"..", "abc"},
		{".", "abc"},
		{"fake", ".."},
		{"fake/x", "abc"},
		{"fake", "a/b"},
		{"fake", "a%2Fb"},
		{"fake", "a.b"},
		{"fa ke", "abc"},
		{"fake:", "abc"},
		{"fake:80a", "abc"},
		{"fake:123456", "abc"},
		{"fake..com", "abc"},
		{".fake", "abc"},
		{"[::1", "abc"},
		{"[zz]", "abc"},
		{"fake?x=1", "abc"},
		{"fake", "abc?x"},
		{strings.Repeat("a", 256), "abc"},
		{"fake", strings.Repeat("a", 256)},
	} {
		if m, err := c.Download(t.Context(), tc.server, tc.mediaID, 100); !errors.Is(err, matrix.ErrBadMediaID) {
			t.Errorf("Download(%q, %q) = %+v, %v; want ErrBadMediaID", tc.server, tc.mediaID, m, err)
		}
	}
	if n := requests(); n != 0 {
		t.Errorf("%d requests reached the server, want none", n)
	}
	// Valid names pass the check and reach the server.
	for _, server := range []string{"fake", "matrix.example.org:8448", "127.0.0.1", "[::1]:8448", "a-b.c"} {
		if _, err := c.Download(t.Context(), server, "Ab_9-z", 100); errors.Is(err, matrix.ErrBadMediaID) {
			t.Errorf("Download(%q, ...) refused a valid server name", server)
		}
	}
}
