package web_test

import (
	"fmt"
	"net/http/httptest"

	"github.com/tether-agent/tether/plugins/ws/web"
)

func ExampleHandler() {
	h := web.Handler()
	for _, p := range []string{"/", "/vendor/xterm.js", "/nope"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", p, nil))
		fmt.Println(p, rec.Code, rec.Header().Get("Content-Type"))
	}
	// Output:
	// / 200 text/html; charset=utf-8
	// /vendor/xterm.js 200 text/javascript; charset=utf-8
	// /nope 404 text/plain; charset=utf-8
}
