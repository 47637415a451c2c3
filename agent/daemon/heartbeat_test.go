package daemon

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/gpuaas/gpuaas/agent/config"
)

// The agent beats at the longer of its own interval and the one the
// leader asked for; a kick wakes the loop once, however often it comes.
func TestHeartbeatIntervalAndKick(t *testing.T) {
	d := &Daemon{cfg: config.Config{HeartbeatInterval: config.Duration(10 * time.Second)}, hbKick: make(chan struct{}, 1)}
	assert.Equal(t, 10*time.Second, d.heartbeatInterval(), "nothing asked: its own")
	d.hbAsked = 50 * time.Second
	assert.Equal(t, 50*time.Second, d.heartbeatInterval(), "a large fleet: the leader's")
	d.hbAsked = 2 * time.Second
	assert.Equal(t, 10*time.Second, d.heartbeatInterval(), "never more often than configured")

	d.kickHeartbeat()
	d.kickHeartbeat() // does not block
	select {
	case <-d.hbKick:
	default:
		t.Fatal("no kick")
	}
	select {
	case <-d.hbKick:
		t.Fatal("two kicks queued")
	default:
	}
}
