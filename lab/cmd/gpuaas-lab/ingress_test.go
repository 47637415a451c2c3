package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gpuaas/gpuaas/lab/launch"
)

// The lab's ingress names are valid for launch.SetupIngress, differ per
// lab folder and are stable for one.
func TestIngressName(t *testing.T) {
	a, b := ingressName("/srv/a/.lab"), ingressName("/srv/b/.lab")
	assert.NotEqual(t, a, b)
	assert.Equal(t, a, ingressName("/srv/a/.lab"))
	assert.Regexp(t, `^gpi-[0-9a-f]{4}$`, a)
	// Room for the public side's name and the veth's (launch.IngressOptions).
	assert.LessOrEqual(t, len(a), 11)
}

// The summary tells how to reach a slice from the public side, and says
// nothing without ingress.
func TestIngressHint(t *testing.T) {
	var b bytes.Buffer
	ingressHint(&b, nil)
	assert.Empty(t, b.String())
	ingressHint(&b, &launch.LabIngress{Netns: "/run/netns/gpi-1a2b", PublicNetns: "gpi-1a2b-pub"})
	assert.Contains(t, b.String(), "ip netns exec gpi-1a2b-pub curl http://203.0.113.10:40000/")
	assert.Contains(t, b.String(), "site lab hands out 203.0.113.10:40000-40099")
}
