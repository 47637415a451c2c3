package uevent

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
)

func TestParse(t *testing.T) {
	e, err := Parse([]byte("add@/devices/pci0000:97/0000:97:01.0/0000:9a:00.0\x00ACTION=add\x00DEVPATH=/devices/pci0000:97/0000:97:01.0/0000:9a:00.0\x00SUBSYSTEM=pci\x00PCI_SLOT_NAME=0000:9a:00.0\x00SEQNUM=4242\x00"))
	require.NoError(t, err)
	assert.Equal(t, "add", e.Action)
	assert.Equal(t, "pci", e.Subsystem)
	assert.Equal(t, "0000:9a:00.0", e.Env["PCI_SLOT_NAME"])
	assert.True(t, e.Hardware())

	for name, tc := range map[string]struct {
		ev   Event
		want bool
	}{
		"pci remove":        {Event{Action: "remove", Subsystem: "pci"}, true},
		"block change":      {Event{Action: "change", Subsystem: "block"}, true},
		"net add":           {Event{Action: "add", Subsystem: "net"}, true},
		"pci bind":          {Event{Action: "bind", Subsystem: "pci"}, true},
		"nvme add":          {Event{Action: "add", Subsystem: "nvme"}, true},
		"usb add":           {Event{Action: "add", Subsystem: "usb"}, false},
		"cpu online":        {Event{Action: "online", Subsystem: "cpu"}, false},
		"memory offline":    {Event{Action: "offline", Subsystem: "memory"}, false},
		"module add":        {Event{Action: "add", Subsystem: "module"}, false},
		"net unknown event": {Event{Action: "wobble", Subsystem: "net"}, false},
	} {
		assert.Equal(t, tc.want, tc.ev.Hardware(), name)
	}

	for name, bad := range map[string]string{
		"no header":    "ACTION=add\x00",
		"no action":    "add@/x\x00DEVPATH=/x\x00SUBSYSTEM=pci\x00",
		"no devpath":   "add@/x\x00ACTION=add\x00SUBSYSTEM=pci\x00",
		"no subsystem": "add@/x\x00ACTION=add\x00DEVPATH=/x\x00",
		"bad field":    "add@/x\x00ACTION=add\x00junk\x00",
		"udev framing": "libudev\x00\xfe\xed\xca\xfe",
	} {
		_, err := Parse([]byte(bad))
		assert.Error(t, err, name)
	}
}

// A real NETLINK_KOBJECT_UEVENT socket sees the kernel's event for a
// network interface created and deleted in this network namespace.
func TestPrivilegedNetlinkSeesInterfaceEvents(t *testing.T) {
	n, err := Listen()
	if err != nil {
		if os.Getenv("GPUAAS_REQUIRE_PRIVILEGED") != "" {
			require.NoError(t, err)
		}
		t.Skipf("no uevent socket: %v", err)
	}
	defer n.Close()
	name := fmt.Sprintf("gpuaasue%d", os.Getpid()%10000)
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(link); err != nil {
		if os.Getenv("GPUAAS_REQUIRE_PRIVILEGED") != "" {
			require.NoError(t, err)
		}
		t.Skipf("cannot create a veth pair: %v", err)
	}
	defer netlink.LinkDel(link)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan Event, 64)
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx, func(e Event) { got <- e }) }()
	require.NoError(t, netlink.LinkDel(link))
	want := map[string]bool{}
	for !want["remove"] {
		select {
		case e := <-got:
			if e.Subsystem == "net" && e.Env["INTERFACE"] == name {
				assert.True(t, e.Hardware(), "%+v", e)
				want[e.Action] = true
			}
		case <-ctx.Done():
			t.Fatalf("no remove event for %s (saw %v)", name, want)
		}
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "Run ends with its context")
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestChanSource(t *testing.T) {
	c := make(Chan, 2)
	c <- Event{Action: "add", Subsystem: "pci"}
	close(c)
	var seen []Event
	require.NoError(t, c.Run(context.Background(), func(e Event) { seen = append(seen, e) }))
	assert.Len(t, seen, 1)
}
