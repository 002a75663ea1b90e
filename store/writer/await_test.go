package writer

import (
	"context"
	"testing"
)

func TestAReplyThatHasArrivedWinsOverAnEndedContextAndAStoppedWriter(t *testing.T) {
	// A select between ready cases picks one at random, so each case runs
	// many times: picking the ended context even once fails it.
	const rounds = 200
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	stopped := make(chan struct{})
	close(stopped)
	for _, tc := range []struct {
		name string
		done <-chan struct{}
	}{
		{"writer running", make(chan struct{})},
		{"writer stopped", stopped},
	} {
		for i := range rounds {
			reply := make(chan int, 1)
			reply <- i
			got, err := await(ended, reply, tc.done)
			if err != nil || got != i {
				t.Fatalf("%s, round %d: got (%d, %v), want the reply (%d, nil)", tc.name, i, got, err, i)
			}
		}
	}
}
