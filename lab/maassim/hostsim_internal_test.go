package maassim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCountCPUs(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"0-47,96-143": 96, "0": 1, "0,2,4-5": 4, "": 0} {
		got, err := countCPUs(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"a-b", "5-1", "1-x"} {
		_, err := countCPUs(bad)
		assert.Error(t, err, bad)
	}
}
