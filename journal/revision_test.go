package journal_test

import (
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

func TestRevisionAfter(t *testing.T) {
	for _, c := range []struct {
		name string
		r, o journal.Revision
		want bool
	}{
		{"LaterTimestampWins", journal.Revision{TS: 2, EventID: "$a"}, journal.Revision{TS: 1, EventID: "$z"}, true},
		{"EarlierTimestampLoses", journal.Revision{TS: 1, EventID: "$z"}, journal.Revision{TS: 2, EventID: "$a"}, false},
		{"TieGoesToTheGreaterID", journal.Revision{TS: 5, EventID: "$b"}, journal.Revision{TS: 5, EventID: "$a"}, true},
		{"TieLostToTheGreaterID", journal.Revision{TS: 5, EventID: "$a"}, journal.Revision{TS: 5, EventID: "$b"}, false},
		{"ARevisionIsNotAfterItself", journal.Revision{TS: 5, EventID: "$a"}, journal.Revision{TS: 5, EventID: "$a"}, false},
		// Byte order: every upper-case letter sorts before every lower-case one.
		{"LowerCaseBeatsUpperCase", journal.Revision{TS: 5, EventID: "$a"}, journal.Revision{TS: 5, EventID: "$Z"}, true},
		{"UpperCaseLosesToLowerCase", journal.Revision{TS: 5, EventID: "$Z"}, journal.Revision{TS: 5, EventID: "$a"}, false},
		{"DigitsSortBeforeLetters", journal.Revision{TS: 5, EventID: "$A"}, journal.Revision{TS: 5, EventID: "$9"}, true},
		{"APrefixSortsFirst", journal.Revision{TS: 5, EventID: "$ab"}, journal.Revision{TS: 5, EventID: "$a"}, true},
		{"TimestampOutranksTheID", journal.Revision{TS: 6, EventID: "$A"}, journal.Revision{TS: 5, EventID: "$zzz"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.r.After(c.o); got != c.want {
				t.Fatalf("%+v.After(%+v) = %v, want %v", c.r, c.o, got, c.want)
			}
		})
	}
}
