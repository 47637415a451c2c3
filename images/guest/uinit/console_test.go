package main

import (
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// scripted is a console: typed input, collected output.
type scripted struct {
	in  io.Reader
	out strings.Builder
}

func (s *scripted) Read(p []byte) (int, error)  { return s.in.Read(p) }
func (s *scripted) Write(p []byte) (int, error) { return s.out.Write(p) }

func TestConsoleSession(t *testing.T) {
	c := &scripted{in: strings.NewReader("root\nwrong\nroot\n" + consolePassword + "\n\nip link set eth0 down\nexit\n")}
	var echo []bool
	var ran []string
	err := consoleSession(c, "slice-a1", func(on bool) { echo = append(echo, on) }, func(line string, out io.ReadWriter) {
		ran = append(ran, line)
		io.WriteString(out, "ran "+line+"\n")
	})
	require.ErrorIs(t, err, io.EOF)
	out := c.out.String()
	require.Contains(t, out, "slice-a1 login: Password: \nLogin incorrect")
	require.Contains(t, out, "root@slice-a1:~# ran ip link set eth0 down\n")
	require.Contains(t, out, "logout\n\nslice-a1 login: ")
	require.NotContains(t, out, consolePassword, "the password is never written back")
	require.Equal(t, []string{"ip link set eth0 down"}, ran, "a wrong password runs nothing; an empty line neither")
	require.Equal(t, []bool{false, true, false, true}, echo, "echo is off while the password is typed")
}
