/* libFuzzer target for the protocol decoder (`make fuzz`, `make fuzz-short`): any input
 * must decode cleanly or fail with a message; a decoded message must re-encode, decode
 * again to an equal message, and re-encode to the same bytes. */
#include "proto/proto.h"
#include <string.h>

static Pool pool_a, pool_b;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ProtoMsg m = {0}, again = {0};
    m.pool_into = &pool_a;
    again.pool_into = &pool_b;
    RsErr e = {0};
    int rc = proto_decode(data, size, &m, &e);
    if (rc != RS_OK) {
        /* Every failure names itself and is one of the decoder's codes. */
        RS_ASSERT(rc == RS_EFORMAT || rc == RS_EPROTO || rc == RS_EUNSUPPORTED);
        RS_ASSERT(e.code == rc && e.msg[0] != 0 && m.type == PROTO_NONE);
        proto_msg_clear(&m);
        return 0;
    }
    msgpack_sbuffer b1, b2;
    msgpack_sbuffer_init(&b1);
    msgpack_sbuffer_init(&b2);
    RS_ASSERT(proto_encode(&m, &b1, &e) == RS_OK);
    RS_ASSERT(proto_decode(b1.data, b1.size, &again, &e) == RS_OK);
    RS_ASSERT(proto_msg_equal(&m, &again));
    RS_ASSERT(proto_encode(&again, &b2, &e) == RS_OK);
    RS_ASSERT(b1.size == b2.size && memcmp(b1.data, b2.data, b1.size) == 0);
    /* The canonical encoding is never longer than what was accepted. */
    RS_ASSERT(b1.size <= size);
    msgpack_sbuffer_destroy(&b1);
    msgpack_sbuffer_destroy(&b2);
    proto_msg_clear(&m);
    proto_msg_clear(&again);
    return 0;
}
