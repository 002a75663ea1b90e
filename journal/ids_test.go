package journal_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

func TestValidUserID(t *testing.T) {
	for _, c := range []struct {
		id   string
		want bool
	}{
		{"@alice:example.org", true},
		{"@a:b", true},
		{"@alice:example.org:8448", true},
		{"@bot_1.test=x/y:[::1]", true},
		{"@" + strings.Repeat("a", 200) + ":" + strings.Repeat("b", 53), true},  // 255 bytes
		{"@" + strings.Repeat("a", 200) + ":" + strings.Repeat("b", 54), false}, // 256 bytes
		{"", false},
		{"@", false},
		{"alice:example.org", false},
		{"@alice", false},
		{"@:example.org", false},
		{"@alice:", false},
		{"!alice:example.org", false},
		{"@ali ce:example.org", false},
		{"@alice:example.org\n", false},
		{"@alicé:example.org", false},
		{"@alice:exa\x7fmple.org", false},
	} {
		if got := journal.ValidUserID(c.id); got != c.want {
			t.Errorf("ValidUserID(%q) = %v, want %v", c.id, got, c.want)
		}
	}
}

func TestValidRoomID(t *testing.T) {
	for _, c := range []struct {
		id   string
		want bool
	}{
		{"!room:example.org", true},
		// Room version 12 IDs carry no server part.
		{"!31hneApxJ_1o-63DmFrpeqnkFfWppnzWso1JvH3ogLM", true},
		{"!x", true},
		{"!" + strings.Repeat("r", 254), true},
		{"!" + strings.Repeat("r", 255), false},
		{"", false},
		{"!", false},
		{"room:example.org", false},
		{"#alias:example.org", false},
		{"!room :example.org", false},
		{"!room\t:example.org", false},
		{"!rööm:example.org", false},
	} {
		if got := journal.ValidRoomID(c.id); got != c.want {
			t.Errorf("ValidRoomID(%q) = %v, want %v", c.id, got, c.want)
		}
	}
}

func TestValidEventID(t *testing.T) {
	for _, c := range []struct {
		id   string
		want bool
	}{
		{"$abc", true},
		{"$Rqnc-F-dvnEYJTyHq_iKxU2bZ1CI92-kuZq3a5lr5Zg", true},
		{"$1234:example.org", true},
		{"$a+b/c=", true},
		{"$" + strings.Repeat("e", 254), true},
		{"$" + strings.Repeat("e", 255), false},
		{"", false},
		{"$", false},
		{"abc", false},
		{"!abc", false},
		{"$a b", false},
		{"$ab\x00", false},
		{"$é", false},
	} {
		if got := journal.ValidEventID(c.id); got != c.want {
			t.Errorf("ValidEventID(%q) = %v, want %v", c.id, got, c.want)
		}
	}
}

func TestNewPrincipal(t *testing.T) {
	for _, c := range []struct {
		name, agent, user string
		ok                bool
	}{
		{"OK", "helper", "@bot:example.org", true},
		{"OKEveryAllowedCharacter", "Agent_1.two-3", "@bot:example.org", true},
		{"OKLongestAgentName", strings.Repeat("a", 64), "@bot:example.org", true},
		{"ErrEmptyAgent", "", "@bot:example.org", false},
		{"ErrAgentTooLong", strings.Repeat("a", 65), "@bot:example.org", false},
		{"ErrAgentWithSpace", "my agent", "@bot:example.org", false},
		{"ErrAgentWithAt", "agent@home", "@bot:example.org", false},
		{"ErrAgentWithColon", "a:b", "@bot:example.org", false},
		{"ErrAgentNonASCII", "agënt", "@bot:example.org", false},
		{"ErrUserWithoutServer", "helper", "@bot", false},
		{"ErrUserWithoutSigil", "helper", "bot:example.org", false},
		{"ErrEmptyUser", "helper", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := journal.NewPrincipal(c.agent, c.user)
			if !c.ok {
				if !errors.Is(err, journal.ErrInvalidPrincipal) {
					t.Fatalf("NewPrincipal(%q, %q) error = %v, want ErrInvalidPrincipal", c.agent, c.user, err)
				}
				if p != (journal.Principal{}) {
					t.Fatalf("NewPrincipal returned %+v with an error, want the zero value", p)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewPrincipal(%q, %q): %v", c.agent, c.user, err)
			}
			if got, want := p, (journal.Principal{Agent: c.agent, UserID: c.user}); got != want {
				t.Fatalf("principal = %+v, want %+v", got, want)
			}
		})
	}
}

func TestPrincipalString(t *testing.T) {
	p := journal.Principal{Agent: "helper", UserID: "@bot:example.org"}
	if got, want := p.String(), "helper@@bot:example.org"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

func TestEncodeThread(t *testing.T) {
	root := "$root"
	bad := "root"
	empty := ""
	for _, c := range []struct {
		name   string
		thread *string
		want   string
		err    bool
	}{
		{"RoomIsTheEmptyKey", nil, "", false},
		{"ThreadIsItsRoot", &root, "$root", false},
		{"ErrNotAnEventID", &bad, "", true},
		{"ErrEmptyThreadIsNotTheRoom", &empty, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := journal.EncodeThread(c.thread)
			if c.err {
				if !errors.Is(err, journal.ErrInvalidArgument) {
					t.Fatalf("error = %v, want ErrInvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("EncodeThread: %v", err)
			}
			if got != c.want {
				t.Fatalf("key = %q, want %q", got, c.want)
			}
		})
	}
}

func TestDecodeThread(t *testing.T) {
	if got := journal.DecodeThread(""); got != nil {
		t.Fatalf("DecodeThread(\"\") = %q, want nil", *got)
	}
	got := journal.DecodeThread("$root")
	if got == nil || *got != "$root" {
		t.Fatalf("DecodeThread($root) = %v, want $root", got)
	}
	// Round trip: every key the encoder makes decodes back to its input.
	for _, th := range []*string{nil, got} {
		key, err := journal.EncodeThread(th)
		if err != nil {
			t.Fatalf("EncodeThread: %v", err)
		}
		back := journal.DecodeThread(key)
		if (back == nil) != (th == nil) || (back != nil && *back != *th) {
			t.Fatalf("round trip of %v gave %v", th, back)
		}
	}
}
