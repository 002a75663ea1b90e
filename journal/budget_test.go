package journal_test

import (
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

func TestEstimateDecoded(t *testing.T) {
	for _, c := range []struct {
		name string
		doc  string
		want int64
	}{
		{"Empty", ``, 0},
		{"Scalar", `12345`, 5},
		{"String", `"abc"`, 5},
		{"EmptyObject", `{}`, 2 + 192},
		{"EmptyArray", `[]`, 2 + 96},
		{"OneMember", `{"a":1}`, 7 + 192 + 56},
		{"ArrayOfThree", `[1,2,3]`, 7 + 96 + 2*56},
		{"Nested", `{"a":[{},[]]}`, 13 + 2*192 + 2*96 + 56 + 56},
		// Structure inside strings costs nothing beyond its bytes.
		{"PunctuationInsideAString", `"{[,:]}"`, 8},
		{"EscapedQuoteStaysInsideTheString", `"a\",{"`, 7},
		{"EscapedBackslashEndsBeforeTheQuote", `["a\\",{}]`, 10 + 96 + 56 + 192},
		{"KeyAndValueStrings", `{"k:":"v,"}`, 11 + 192 + 56},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := journal.EstimateDecoded([]byte(c.doc)); got != c.want {
				t.Fatalf("EstimateDecoded(%s) = %d, want %d", c.doc, got, c.want)
			}
		})
	}
}

func TestPageBudgetAdmit(t *testing.T) {
	t.Run("TheFirstMessageAlwaysFits", func(t *testing.T) {
		b := journal.PageBudget{StoredLimit: 10, DecodedLimit: 10}
		if !b.Admit([]byte(strings.Repeat("x", 1000)), true) {
			t.Fatalf("the first message of a page was refused")
		}
		if b.Admit([]byte(`1`), false) {
			t.Fatalf("a second message fit a spent budget")
		}
	})

	t.Run("TheStoredLimitIsInclusive", func(t *testing.T) {
		b := journal.PageBudget{StoredLimit: 10, DecodedLimit: 1 << 20}
		if !b.Admit([]byte(`"123"`), true) || !b.Admit([]byte(`"123"`), false) {
			t.Fatalf("ten stored bytes did not fit a ten-byte budget")
		}
		if b.Admit([]byte(`1`), false) {
			t.Fatalf("an eleventh byte fit a ten-byte budget")
		}
	})

	t.Run("TheDecodedLimitBindsOnItsOwn", func(t *testing.T) {
		// Two empty objects cost 2 bytes stored but 194 decoded each.
		b := journal.PageBudget{StoredLimit: 1 << 20, DecodedLimit: 300}
		if !b.Admit([]byte(`{}`), true) {
			t.Fatalf("first message refused")
		}
		if b.Admit([]byte(`{}`), false) {
			t.Fatalf("a message beyond the decoded budget fit")
		}
		// A refused message is not charged: a smaller one still fits.
		if !b.Admit([]byte(`"x"`), false) {
			t.Fatalf("a message within the remaining budget was refused")
		}
	})

	t.Run("ZeroLimitsMeanTheDefaults", func(t *testing.T) {
		var b journal.PageBudget
		big := []byte(`"` + strings.Repeat("x", 8<<20) + `"`) // 8 MiB + 2; with the 8 MiB - 2 below, exactly 16 MiB
		if !b.Admit(big, true) || !b.Admit(big[:len(big)-4], false) {
			t.Fatalf("16 MiB did not fit the default stored budget")
		}
		if b.Admit([]byte(`"xx"`), false) {
			t.Fatalf("more than %d stored bytes fit the default budget", journal.PageStoredBudget)
		}
	})
}
