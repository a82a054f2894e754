package vtquery_test

import (
	"fmt"

	"github.com/tether-agent/tether/wire/vtquery"
)

// A replay holds a program's queries, split across two reads: the filter
// takes them out and leaves everything else as it was.
func ExampleFilter() {
	f := vtquery.New()
	out := f.Append(nil, []byte("\x1b[1mvim\x1b[m\x1b[6"))
	out = f.Append(out, []byte("n\x1b]11;?\x07 ok\r\n"))
	out = f.Flush(out)
	fmt.Printf("%q, %d queries removed\n", out, f.Dropped())
	// Output: "\x1b[1mvim\x1b[m ok\r\n", 2 queries removed
}
