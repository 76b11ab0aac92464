/*
 * server/api/sse.h: the Server-Sent Events writer of a streamed completion. A
 * byte queue of whole events ("data: JSON\n\n", "data: [DONE]\n\n", ":
 * comment\n\n") that libmicrohttpd's content reader drains.
 *
 * JSON is written compact, and jansson escapes every control character in
 * strings, so an event's data is always one line: no text a model or a
 * client produces can end an event early or forge one. If memory runs out
 * the queue is marked failed and takes nothing more; the reader then ends
 * the response with an error instead of sending a stream with a hole in it.
 *
 * Prefix: sse_. Pure: no I/O, no globals. Thread: one per queue.
 */
#ifndef GPT2D_SERVER_SSE_H
#define GPT2D_SERVER_SSE_H

#include <jansson.h>
#include <stddef.h>

typedef struct {
    char *buf;
    size_t len, cap; /* bytes queued, allocated          */
    size_t off;      /* bytes of buf already taken        */
    int done;        /* [DONE] queued: nothing may follow  */
    int failed;      /* out of memory: the stream is broken */
    size_t limit;    /* the backlog bound in bytes (0: none); see sse_over_limit */
    /* What the stream may hold in all (max_response_bytes): an event that
     * would take total past max_bytes is refused whole and sets over; the
     * ending (sse_final) is exempt. 0: no bound. */
    size_t max_bytes;
    size_t total;   /* bytes queued over the stream's life (the ending's too) */
    int over;       /* an event was refused for max_bytes                      */
    int mid;        /* the bytes taken so far end inside an event (sse_cut)    */
    size_t dropped; /* events (comments aside) sse_cut dropped unsent         */
    char last;      /* the last byte taken                                     */
} sse_queue;

/* An empty queue (all zero). */
void sse_init(sse_queue *q);
void sse_free(sse_queue *q);

/* Queues "data: <obj as compact JSON>\n\n". 0, or -1 when the queue failed,
 * is done, or obj cannot be written. Does not take obj's reference. */
int sse_data(sse_queue *q, const json_t *obj);
/* Queues "data: <json>\n\n" for text that is already one line of JSON. */
int sse_data_raw(sse_queue *q, const char *json);
/* Queues ": <text>\n\n", a comment that clients ignore (keep-alive); text
 * must not contain a newline (-1). */
int sse_comment(sse_queue *q, const char *text);
/* Queues "event: <name>\ndata: <obj as compact JSON>\n\n" (the Responses
 * API's named events); name is at most 80 bytes without CR or LF (-1). */
int sse_event(sse_queue *q, const char *name, const json_t *obj);
/* Marks the queue done without a [DONE] line (a stream that ends with its
 * last event, as the Responses API's do). */
int sse_end(sse_queue *q);
/* Queues "data: [DONE]\n\n" and marks the queue done. */
int sse_done(sse_queue *q);

/* Whether n more bytes of events fit under max_bytes (always with none). */
int sse_fits(const sse_queue *q, size_t n);
/* The bytes sse_event would queue for name and obj (0: obj cannot be
 * written). */
size_t sse_event_bytes(const char *name, const json_t *obj);
/* What is queued from now on is the stream's ending (an error event,
 * [DONE], a Responses stream's last events): max_bytes no longer applies.
 * The ending's size is the caller's bound. */
void sse_final(sse_queue *q);
/* Cuts a stream whose client stopped reading: of what waits unsent, only
 * the rest of the event the client has partly taken stays (so that the
 * stream goes on at an event boundary), the whole events after it are
 * dropped (counted in dropped, comments aside, for a caller that numbers
 * its events), and nothing but the ending (sse_final) may follow. Returns
 * the bytes dropped. */
size_t sse_cut(sse_queue *q);

/* Bytes waiting to be sent. */
size_t sse_pending(const sse_queue *q);
/* Copies up to max waiting bytes to out and removes them; the count. */
size_t sse_take(sse_queue *q, char *out, size_t max);
/* Whether the stream is complete: done and everything taken. */
int sse_finished(const sse_queue *q);
/* Whether more than q->limit bytes wait to be sent (never with limit 0):
 * the client is not reading as fast as the stream is produced. Queuing
 * goes on regardless; the caller decides what a backlog costs. */
int sse_over_limit(const sse_queue *q);

#endif
