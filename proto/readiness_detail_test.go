package proto

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestReadinessDetailNamesItsAllocation(t *testing.T) {
	d := ReadinessDetail("a1", []string{"dhcp: 52:54:00:00:00:10 holds 10.0.0.10", "ssh: instance-id i-1"})
	assert.Equal(t, "readiness of allocation a1: dhcp: 52:54:00:00:00:10 holds 10.0.0.10; ssh: instance-id i-1", d)
	assert.LessOrEqual(t, len(ReadinessDetail("a1", []string{strings.Repeat("x", 2*MaxHealthDetail)})), MaxHealthDetail)
	for _, tc := range []struct {
		detail, alloc string
		want          bool
	}{
		{d, "a1", true},
		{d, "a10", false}, // another allocation's evidence
		{d, "a", false},
		{"dhcp: 52:54:00:00:00:10 holds 10.0.0.10 (lease until ...); ssh: ...", "a2", true}, // unlabelled, from before labels
		{"gpu 0000:18:00.0: Xid 79", "a1", false},
		{"", "a1", false},
	} {
		assert.Equal(t, tc.want, IsReadinessDetailOf(tc.detail, tc.alloc), "%q of %s", tc.detail, tc.alloc)
	}
}
