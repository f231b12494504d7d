// Package demo holds what the example programs share that is not the point
// of the example: running a consumer until a route has settled a number of
// messages, and printing the per-route table. The routes themselves, the
// windows and the handlers stay in each example, where a reader looks.
package demo
