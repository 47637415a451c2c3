package config

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// ByteSize is a size in bytes, written as a number with an optional
// binary suffix: 500GiB, 64MiB, 1TiB, 4096.
type ByteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

func (b ByteSize) String() string {
	for _, u := range byteUnits {
		if b != 0 && int64(b)%u.mult == 0 {
			return strconv.FormatInt(int64(b)/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

// Set implements flag.Value.
func (b *ByteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return fmt.Errorf("%q is not a size (a number with an optional KiB, MiB, GiB or TiB suffix)", s)
	}
	*b = ByteSize(n * mult)
	return nil
}

// MarshalJSON writes the size as a string ("100GiB").
func (b ByteSize) MarshalJSON() ([]byte, error) { return json.Marshal(b.String()) }

// UnmarshalJSON reads a size string or a plain number of bytes.
func (b *ByteSize) UnmarshalJSON(data []byte) error {
	var n int64
	if err := json.Unmarshal(data, &n); err == nil {
		*b = ByteSize(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("size: want a string such as \"100GiB\" or a number of bytes: %w", err)
	}
	return b.Set(s)
}
