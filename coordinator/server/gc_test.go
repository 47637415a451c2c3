package server

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTuneGC(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	prev, err := TuneGC(DefaultGCPercent, 0)
	require.NoError(t, err)
	assert.Equal(t, 100, prev)
	prev, err = TuneGC(0, 0) // leaves it
	require.NoError(t, err)
	assert.Equal(t, DefaultGCPercent, prev)
	assert.Equal(t, DefaultGCPercent, debug.SetGCPercent(DefaultGCPercent))
	_, err = TuneGC(100, -1)
	assert.Error(t, err)
	assert.Equal(t, DefaultGCPercent, debug.SetGCPercent(DefaultGCPercent), "a refused call changes nothing")
}
