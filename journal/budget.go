package journal

// Page budgets bound the memory one conversation page can cost, whatever
// the messages in it name or nest.
const (
	// PageStoredBudget bounds the stored content bytes of one page.
	PageStoredBudget = 16 << 20
	// PageDecodedBudget bounds the estimated decoded size of one page.
	PageDecodedBudget = 64 << 20
)

// Decoding overheads per JSON construct, measured for Go's generic decoding:
// short strings and numbers in a list cost about ten times their bytes,
// nested empty containers about forty-five.
const (
	decodedPerArray     = 96
	decodedPerObject    = 192
	decodedPerSeparator = 56
)

// EstimateDecoded estimates the memory decoding a JSON document costs: its
// bytes plus a fixed overhead per array, object, comma and colon outside
// strings. It reads the bytes once and allocates nothing.
func EstimateDecoded(doc []byte) int64 {
	n := int64(len(doc))
	inString, escaped := false, false
	for _, c := range doc {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[':
			n += decodedPerArray
		case '{':
			n += decodedPerObject
		case ',', ':':
			n += decodedPerSeparator
		}
	}
	return n
}

// maxDecodedPerByte bounds the decoded estimate of any document: the
// densest input is "{}," repeated, 192+56 per three bytes, under 97 a byte.
const maxDecodedPerByte = 97

// PageBudget tracks one page's spending against both budgets. The decoded
// estimate reads every byte, so it is only computed once the stored bytes
// are large enough that the decoded budget could be reached at all; a
// typical page never pays for it.
type PageBudget struct {
	// Limits; zero means the package defaults.
	StoredLimit, DecodedLimit int64

	stored, decoded int64
	exact           bool     // decoded holds exact estimates from now on
	unestimated     [][]byte // contents admitted before exact mode
}

func (b *PageBudget) limits() (stored, decoded int64) {
	stored, decoded = b.StoredLimit, b.DecodedLimit
	if stored == 0 {
		stored = PageStoredBudget
	}
	if decoded == 0 {
		decoded = PageDecodedBudget
	}
	return stored, decoded
}

// Admit reports whether a message with this content still fits the page,
// and if so charges it. The first message of a page always fits, so a page
// is never empty because of one large message.
func (b *PageBudget) Admit(content []byte, first bool) bool {
	storedLimit, decodedLimit := b.limits()
	s := int64(len(content))
	if !b.exact && (b.stored+s)*maxDecodedPerByte > decodedLimit {
		// The decoded budget is now reachable: estimate what was skipped.
		b.exact = true
		for _, c := range b.unestimated {
			b.decoded += EstimateDecoded(c)
		}
		b.unestimated = nil
	}
	if !b.exact {
		if !first && b.stored+s > storedLimit {
			return false
		}
		b.stored += s
		b.unestimated = append(b.unestimated, content)
		return true
	}
	d := EstimateDecoded(content)
	if !first && (b.stored+s > storedLimit || b.decoded+d > decodedLimit) {
		return false
	}
	b.stored += s
	b.decoded += d
	return true
}
