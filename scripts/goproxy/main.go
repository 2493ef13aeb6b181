// Command goproxy is the reference reverse proxy of scripts/bench-peers.sh: Go's
// httputil.ReverseProxy in front of one upstream, with nothing else, so that what the ingress
// adds on the forward path (matching, limiting, headers) is measured against what net/http's
// proxying costs by itself.
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:19310", "address to listen on")
	upstream := flag.String("upstream", "http://127.0.0.1:19100", "URL to proxy to")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil {
		log.Fatal(err)
	}
	p := httputil.NewSingleHostReverseProxy(u)
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	p.Transport = t
	log.Fatal(http.ListenAndServe(*listen, p))
}
