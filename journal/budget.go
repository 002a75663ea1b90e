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

// PageBudget tracks one page's spending against both budgets.
type PageBudget struct {
	stored, decoded int64
	// Limits; zero means the package defaults.
	StoredLimit, DecodedLimit int64
}

// Admit reports whether a message with this content still fits the page,
// and if so charges it. The first message of a page always fits, so a page
// is never empty because of one large message.
func (b *PageBudget) Admit(content []byte, first bool) bool {
	storedLimit, decodedLimit := b.StoredLimit, b.DecodedLimit
	if storedLimit == 0 {
		storedLimit = PageStoredBudget
	}
	if decodedLimit == 0 {
		decodedLimit = PageDecodedBudget
	}
	s, d := int64(len(content)), EstimateDecoded(content)
	if !first && (b.stored+s > storedLimit || b.decoded+d > decodedLimit) {
		return false
	}
	b.stored += s
	b.decoded += d
	return true
}
