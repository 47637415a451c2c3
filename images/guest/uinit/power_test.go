package main

import (
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
)

// rawEvent encodes a struct input_event as the kernel writes it on amd64.
func rawEvent(typ, code uint16, value int32) []byte {
	b := make([]byte, inputEventSize)
	binary.NativeEndian.PutUint64(b[0:8], 1732233600) // tv_sec
	binary.NativeEndian.PutUint64(b[8:16], 123456)    // tv_usec
	binary.NativeEndian.PutUint16(b[16:18], typ)
	binary.NativeEndian.PutUint16(b[18:20], code)
	binary.NativeEndian.PutUint32(b[20:24], uint32(value))
	return b
}

func cat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

const evSyn = 0x00

func TestParseInputEvents(t *testing.T) {
	t.Parallel()
	press := rawEvent(evKey, keyPower, 1)
	syn := rawEvent(evSyn, 0, 0)
	for _, tc := range []struct {
		name    string
		in      []byte
		want    []inputEvent
		rest    int
		pressed bool
	}{
		{name: "empty", in: nil},
		{name: "short read", in: press[:23], rest: 23},
		{name: "press then sync", in: cat(press, syn),
			want: []inputEvent{{evKey, keyPower, 1}, {evSyn, 0, 0}}, pressed: true},
		{name: "press then partial", in: cat(press, syn[:5]),
			want: []inputEvent{{evKey, keyPower, 1}}, rest: 5, pressed: true},
		{name: "release", in: rawEvent(evKey, keyPower, 0), want: []inputEvent{{evKey, keyPower, 0}}},
		{name: "autorepeat", in: rawEvent(evKey, keyPower, 2), want: []inputEvent{{evKey, keyPower, 2}}},
		{name: "other key (KEY_SLEEP)", in: rawEvent(evKey, 142, 1), want: []inputEvent{{evKey, 142, 1}}},
		{name: "wrong type (EV_MSC code 116)", in: rawEvent(0x04, keyPower, 1), want: []inputEvent{{0x04, keyPower, 1}}},
		{name: "negative value", in: rawEvent(0x03, 0, -7), want: []inputEvent{{0x03, 0, -7}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, rest := parseInputEvents(tc.in)
			if d := cmp.Diff(tc.want, evs); d != "" {
				t.Fatalf("events (-want +got):\n%s", d)
			}
			require.Len(t, rest, tc.rest)
			pressed := false
			for _, ev := range evs {
				pressed = pressed || isPowerPress(ev)
			}
			require.Equal(t, tc.pressed, pressed)
		})
	}
}

func TestParsePowerButtons(t *testing.T) {
	t.Parallel()
	// /proc/bus/input/devices of the lab guest (q35, OVMF) with button.ko
	// and evdev.ko loaded, plus made-up entries.
	const devices = `I: Bus=0019 Vendor=0000 Product=0001 Version=0000
N: Name="Power Button"
P: Phys=PNP0C0C/button/input0
S: Sysfs=/devices/LNXSYSTM:00/LNXSYBUS:00/PNP0C0C:00/input/input0
U: Uniq=
H: Handlers=kbd event0 
B: PROP=0
B: EV=3
B: KEY=10000000000000 0

I: Bus=0019 Vendor=0000 Product=0001 Version=0000
N: Name="Power Button"
P: Phys=LNXPWRBN/button/input0
S: Sysfs=/devices/LNXSYSTM:00/LNXPWRBN:00/input/input1
U: Uniq=
H: Handlers=kbd event1 
B: PROP=0
B: EV=3
B: KEY=10000000000000 0

I: Bus=0011 Vendor=0001 Product=0001 Version=ab41
N: Name="AT Translated Set 2 keyboard"
H: Handlers=sysrq kbd event2 leds 

N: Name="Power Button"
H: Handlers=kbd event../../etc/passwd js0

N: Name="Sleep Button"
H: Handlers=kbd event4
`
	require.Equal(t, []string{"event0", "event1"}, parsePowerButtons(devices))
	require.Empty(t, parsePowerButtons(""))
	require.Empty(t, parsePowerButtons("N: Name=\"Power Button\"\nH: Handlers=kbd\n"), "button.ko without evdev")
}

// chunkReader returns its data in reads of at most n bytes, then err.
type chunkReader struct {
	data []byte
	n    int
	err  error
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	k := min(r.n, len(p), len(r.data))
	copy(p, r.data[:k])
	r.data = r.data[k:]
	return k, nil
}

func TestWatchEvents(t *testing.T) {
	t.Parallel()
	stream := cat(rawEvent(evKey, keyPower, 0), rawEvent(evKey, 142, 1), rawEvent(evSyn, 0, 0),
		rawEvent(evKey, keyPower, 1), rawEvent(evSyn, 0, 0))
	for _, n := range []int{1, 7, 23, 24, 25, 1000} {
		presses := 0
		err := watchEvents(&chunkReader{data: stream, n: n, err: io.EOF}, func() { presses++ })
		require.NoError(t, err, "reads of %d bytes", n)
		require.Equal(t, 1, presses, "reads of %d bytes", n)
	}

	// A press in the same read as an error is still honoured.
	presses := 0
	require.NoError(t, watchEvents(iotest.DataErrReader(&chunkReader{data: rawEvent(evKey, keyPower, 1), n: 24, err: io.EOF}),
		func() { presses++ }))
	require.Equal(t, 1, presses)

	// No press: the reader's error comes back and nothing is pressed.
	boom := errors.New("device gone")
	err := watchEvents(&chunkReader{data: cat(rawEvent(evKey, keyPower, 0), rawEvent(evKey, keyPower, 1)[:10]), n: 24, err: boom},
		func() { t.Fatal("pressed without a press") })
	require.ErrorIs(t, err, boom)
}
