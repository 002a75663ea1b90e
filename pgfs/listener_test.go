package pgfs_test

import (
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/pgfs"
)

// blackHoleProxy forwards loopback TCP connections to the cluster, and
// turns every connection open at a moment into a black hole: both sockets
// stay open and nothing is forwarded either way, as when a NAT entry
// expires or the server's host vanishes without a FIN or an RST. A real
// server cannot be made to do this; connections made afterwards are
// forwarded again.
type blackHoleProxy struct {
	ln       net.Listener
	upstream string
	wg       sync.WaitGroup

	mu     sync.Mutex
	links  []*proxyLink
	closed bool
}

// proxyLink is one forwarded connection, the client's socket and the
// server's.
type proxyLink struct {
	client, server net.Conn
	silent         atomic.Bool
}

func startProxy(t *testing.T, upstream string) *blackHoleProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackHoleProxy{ln: ln, upstream: upstream}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// url is u with its server replaced by the proxy.
func (p *blackHoleProxy) url(t *testing.T, u string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatal("the schema's URL does not parse")
	}
	parsed.Host = p.ln.Addr().String()
	return parsed.String()
}

func (p *blackHoleProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &proxyLink{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		p.links = append(p.links, l)
		p.mu.Unlock()
		p.wg.Go(func() { l.forward(c, s) })
		p.wg.Go(func() { l.forward(s, c) })
	}
}

// forward copies from one socket to the other while the link is not
// silent, and reads and drops what arrives once it is.
func (l *proxyLink) forward(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && !l.silent.Load() {
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !l.silent.Load() {
				// A close passes through; a black hole passes nothing.
				_ = to.Close()
			}
			return
		}
	}
}

// blackHole silences every connection open now and reports how many.
func (p *blackHoleProxy) blackHole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		l.silent.Store(true)
	}
	return len(p.links)
}

func (p *blackHoleProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, l := range p.links {
		_ = l.client.Close()
		_ = l.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// The listener's connection goes half-open: no notification, no error,
// no close ever reaches it. Its heartbeat's unanswered ping drops it, and
// the reconnection wakes every subscriber within a heartbeat, a ping and
// a reconnection, instead of never.
func TestAListenerConnectionGoneHalfOpenIsDroppedAndEverySubscriberWokenWithinAHeartbeat(t *testing.T) {
	u := cluster.Schema(t)
	proxy := startProxy(t, cluster.Addr())
	const heartbeat = 200 * time.Millisecond
	s, err := pgfs.Open(t.Context(), pgfs.Options{URL: proxy.url(t, u), ListenHeartbeat: heartbeat})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	other := mustOpen(t, u)
	v := view(t, other, "bot", "@bot:example.org")
	sub := s.Hints().Subscribe(v.Principal().String())
	defer sub.Close()

	// Every connection of the proxied store goes silent, its listener's
	// among them: Open returned after the listener connected.
	if n := proxy.blackHole(); n == 0 {
		t.Fatal("the proxied store has no connection through the proxy")
	}
	if err := admit(t.Context(), v, "$unheard", 1000); err != nil {
		t.Fatal(err)
	}
	// A heartbeat, a ping as long, the first reconnection delay and a
	// connection, with room for a loaded machine.
	bound := 2*heartbeat + 10*time.Second
	select {
	case <-sub.C():
	case <-time.After(bound):
		t.Fatalf("no wake-up within %v of another store's commit while the listener's connection was half-open", bound)
	}

	// The new connection relays the next commit.
	if err := admit(t.Context(), v, "$heard", 1001); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, sub, "a commit after the listener reconnected")
}
