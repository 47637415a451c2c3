package simslice

import (
	"bufio"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// expect reads the console until want appeared (and returns what came).
func expect(t *testing.T, r *bufio.Reader, want string) string {
	t.Helper()
	var got strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !strings.Contains(got.String(), want) {
			b, err := r.ReadByte()
			if err != nil {
				return
			}
			got.WriteByte(b)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("no %q on the console; got %q", want, got.String())
	}
	require.Contains(t, got.String(), want)
	return got.String()
}

func TestSimulatedGetty(t *testing.T) {
	master, tty, err := openPTY()
	require.NoError(t, err)
	g := &simGuest{linkUp: true}
	go func() {
		defer tty.Close()
		g.getty(tty, "slice-x")
	}()
	defer master.Close()
	r := bufio.NewReader(master)
	expect(t, r, "slice-x login: ")
	_, err = master.Write([]byte("root\r"))
	require.NoError(t, err)
	expect(t, r, "Password: ")
	_, err = master.Write([]byte("wrong\r"))
	require.NoError(t, err)
	out := expect(t, r, "Login incorrect")
	require.NotContains(t, out, "wrong", "the password is not echoed")
	expect(t, r, "login: ")
	_, err = master.Write([]byte(ConsoleUser + "\r"))
	require.NoError(t, err)
	expect(t, r, "Password: ")
	_, err = master.Write([]byte(ConsolePassword + "\r"))
	require.NoError(t, err)
	out = expect(t, r, "root@slice-x:~# ")
	require.NotContains(t, out, ConsolePassword)
	_, err = master.Write([]byte("hostname\r"))
	require.NoError(t, err)
	expect(t, r, "slice-x\r\n")
	_, err = master.Write([]byte("ip link set eth0 down\r"))
	require.NoError(t, err)
	expect(t, r, "# ")
	_, err = master.Write([]byte("ip link\r"))
	require.NoError(t, err)
	expect(t, r, "state DOWN")
	require.False(t, g.linkUp)
	_, err = master.Write([]byte("nosuch\r"))
	require.NoError(t, err)
	expect(t, r, "nosuch: command not found")
}
