// Package brain is the router's routing brain, one for every driver: the
// decider and its chooser (the policies and the precise cost model),
// the decision, the prompt tail that encodes what a decision did not
// need to read, and the bookkeeping of one attempt from its dispatch to
// its end (Booking: the health flight, the event plane's expectation, the
// predicted placements and follower, the approximate policy's table, the
// peer replicas' view). It knows nothing of HTTP.
//
// Two drivers use it through the same calls (Decider.Decide,
// Decision.Dispatch, Booking.FirstByte, Booking.End): the HTTP front door
// (package router), and Virtual, the router without HTTP, sockets or
// goroutines on a clock its caller owns, which the benchmark's
// discrete-event engine (bench/des) drives.
package brain
