package bench

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/mindroomd/mindroomd/testsupport"
)

// genVersion changes whenever a generator below changes what it produces,
// so a fixture cached by an older generator is never reused.
const genVersion = 5

const (
	benchServer = "bench.local"
	// numUsers is the pool of (human) senders; none is a principal, so
	// every message is actionable as in a live conversation.
	numUsers    = 64
	fixtureSeed = 0x6d696e64726f6f6d
)

var (
	// fixtureBaseTS is where fixture conversations start: old enough that
	// every event admitted live during a benchmark is newer.
	fixtureBaseTS = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	// fixtureReceivedMS is the receipt time stamped on fixture rows: the
	// clock testsupport journals run at, so admission can reproduce it.
	fixtureReceivedMS = testsupport.DefaultNow.UnixMilli()
)

func agentName(p int) string { return fmt.Sprintf("agent%02d", p) }
func agentUser(p int) string { return "@" + agentName(p) + ":" + benchServer }
func roomID(r int) string    { return fmt.Sprintf("!room%02d:%s", r, benchServer) }
func userID(u int) string    { return fmt.Sprintf("@user%02d:%s", u, benchServer) }

// gen is a deterministic source of Matrix-like identifiers and text.
type gen struct{ r *rand.Rand }

func newGen(seed1, seed2 uint64) *gen { return &gen{r: rand.New(rand.NewPCG(seed1, seed2))} }

// eventID returns "$" and 43 base64url characters (32 random bytes), the
// shape of room v4+ event IDs: hashed, so every index keyed by it takes
// inserts at scattered leaves.
func (g *gen) eventID() string {
	var b [32]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], g.r.Uint64())
	}
	return "$" + base64.RawURLEncoding.EncodeToString(b[:])
}

var words = strings.Fields(`the a to and of in is it you that for on with this be are have not
	was but at can what do if so just we they about like will my get one all out up
	there when an think your know more time would how some me then now work message
	agent room reply thread edit build deploy test review merge fix`)

// body returns 80-140 bytes of lowercase words: the text event around it
// is ~300 bytes, and no character needs JSON escaping.
func (g *gen) body() string {
	target := 80 + g.r.IntN(61)
	var sb strings.Builder
	sb.Grow(target + 16)
	for sb.Len() < target {
		if sb.Len() > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(words[g.r.IntN(len(words))])
	}
	return sb.String()
}

// contentJSON is the canonical content of a text message with this body
// (keys sorted, no whitespace), as admission stores it.
func contentJSON(body string) string { return `{"body":"` + body + `","msgtype":"m.text"}` }

// fixtureSpec names one generated population of settled text messages.
type fixtureSpec struct {
	// Layout names the shape in the cache key.
	Layout               string
	N, Principals, Rooms int
}

// fixtureMessage is one generated message; Principal and Room are indexes.
type fixtureMessage struct {
	Principal, Room int
	EventID, Sender string
	TS              int64
	Body            string
}

// each yields the spec's messages in receipt order. Timestamps grow by
// up to 3 s, with about one in ten equal to its predecessor so the page
// order's event-ID tie-break is exercised.
func (s fixtureSpec) each(fn func(i int, m fixtureMessage) error) error {
	g := newGen(fixtureSeed, uint64(s.Principals)<<32|uint64(s.Rooms))
	ts := fixtureBaseTS
	for i := 0; i < s.N; i++ {
		if g.r.IntN(10) != 0 {
			ts += 1 + int64(g.r.IntN(3000))
		}
		m := fixtureMessage{
			Principal: g.r.IntN(s.Principals),
			Room:      g.r.IntN(s.Rooms),
			EventID:   g.eventID(),
			Sender:    userID(g.r.IntN(numUsers)),
			TS:        ts,
			Body:      g.body(),
		}
		if err := fn(i, m); err != nil {
			return err
		}
	}
	return nil
}
