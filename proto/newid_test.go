package proto

import (
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// NewID: a valid identifier of the fixed shape, unique and in creation
// order within a process, ordered by time across milliseconds, and
// unique across a counter wrap within one millisecond.
func TestNewID(t *testing.T) {
	id := NewID("alloc")
	require.NoError(t, ValidateID("allocation id", id))
	assert.Regexp(t, `^alloc-[0-9a-f]{16}$`, id)

	var prev string
	seen := map[string]bool{}
	for range 100_000 {
		id := NewID("claim")
		require.False(t, seen[id], "NewID repeated %s", id)
		seen[id] = true
		if prev != "" && id < prev {
			// Only a wrap of the 24-bit counter within one
			// millisecond may go back; it cannot repeat.
			require.Equal(t, prev[:len("claim-")+10], id[:len("claim-")+10], "an ID sorted before the previous one of an earlier millisecond: %s < %s", id, prev)
		}
		prev = id
	}

	at := time.UnixMilli(1_790_000_000_000)
	s := &idSource{}
	s.n.Store(1<<24 - 3) // the counter wraps within this millisecond
	var same []string
	for range 6 {
		same = append(same, s.next("task", at))
	}
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(same))), 6, "unique across the wrap: %v", same)
	for _, id := range same {
		assert.Equal(t, same[0][:len("task-")+10], id[:len("task-")+10], "one millisecond, one 40-bit prefix")
	}
	assert.Greater(t, s.next("task", at.Add(time.Millisecond)), slices.Max(same), "a later millisecond sorts after")

	// Another process (a new leader) in the same millisecond: a counter
	// started elsewhere gives other IDs.
	o := &idSource{}
	o.n.Store(12345)
	assert.NotContains(t, same, o.next("task", at))
}

// validID accepts exactly what the pattern it replaced accepts.
func FuzzValidID(f *testing.F) {
	pattern := regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	for _, s := range []string{"", "a", "alloc-0123abcd", "-a", ".a", "_a", "A", "a.b_c-d", "a b", "ä", "a\x00", "0", "a/b", "a\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validID(s), pattern.MatchString(s); got != want {
			t.Fatalf("validID(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}
