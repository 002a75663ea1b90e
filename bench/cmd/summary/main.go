// Command summary condenses `go test -bench` output into a table of
// benchmark, metric and value, one row per reported metric, so the custom
// metrics of bench/ can be read at a glance.
//
//	go test -run '^$' -bench . ./bench/ | go run ./bench/cmd/summary
//
// It exits non-zero when the input holds no benchmark line or reports a
// failure, because `make bench` pipes through tee and would otherwise hide
// the test binary's exit status.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
)

// procSuffix is the -GOMAXPROCS suffix go test appends to names.
var procSuffix = regexp.MustCompile(`-\d+$`)

type row struct{ bench, metric, value string }

func main() {
	rows, failed, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "summary:", err)
		os.Exit(2)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "BENCHMARK\tMETRIC\tVALUE")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\t%s\n", r.bench, r.metric, r.value)
	}
	w.Flush()
	switch {
	case failed:
		fmt.Fprintln(os.Stderr, "summary: the benchmark run reported a failure")
		os.Exit(1)
	case len(rows) == 0:
		fmt.Fprintln(os.Stderr, "summary: no benchmark results in the input")
		os.Exit(1)
	}
}

// parse reads result lines: name, iterations, then value-unit pairs.
func parse(r io.Reader) (rows []row, failed bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "--- FAIL") || strings.HasPrefix(line, "panic:") {
			failed = true
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := procSuffix.ReplaceAllString(strings.TrimPrefix(f[0], "Benchmark"), "")
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			// ns/op is left out: every suite reports its own rates, and an
			// op here is a whole walk or admission round.
			if err != nil || f[i+1] == "ns/op" {
				continue
			}
			rows = append(rows, row{bench: name, metric: f[i+1], value: format(v)})
		}
	}
	return rows, failed, sc.Err()
}

// format prints large values whole and small ones with up to four
// significant digits, so neither 12345 events/s nor 0.85 ratios turn into
// exponents.
func format(v float64) string {
	switch a := max(v, -v); {
	case a >= 100 || v == float64(int64(v)):
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 1 || a == 0:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
}
