package actors_test

import (
	"runtime"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
)

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func TestAnActorSystemCostsUnderAMegabyteOfHeap(t *testing.T) {
	before := heapInUse()
	system := actors.NewSystem(zerolog.Nop())
	grown := int64(heapInUse()) - int64(before)
	runtime.KeepAlive(system)
	if grown > 1<<20 {
		t.Fatalf("an idle actor system holds %d bytes of heap, want under 1 MiB", grown)
	}
	t.Logf("an idle actor system holds %d bytes of heap", grown)
}
