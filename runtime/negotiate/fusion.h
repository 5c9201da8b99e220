/* The fusion decision (fusion.c): which responses share one fusion
 * buffer, and when rank 0's ready responses stop waiting for more. */
#ifndef HORA_FUSION_H
#define HORA_FUSION_H

#include "runtime/negotiate/message.h"

struct hora__controller;

/* Whether r may share a fusion buffer: allreduces (not Adasum, whose
 * coefficients are each tensor's own) and broadcasts. */
bool hora__response_fusable(const struct hora__response *r);
/* The bytes r's tensors hold. */
uint64_t hora__response_payload(const struct hora__response *r);

/* Fuses the responses of the list head..*tail in place: each fusable one
 * takes in the later compatible ones (same collective, dtype, memory and
 * arithmetic) while they fit `fusion_threshold` bytes together (0: no
 * fusion); the rest keep their order. */
int hora__responses_fuse(struct hora__response *head, struct hora__response ***tail,
                         int64_t fusion_threshold);

/* Whether the controller's ready responses should go out now: yes when
 * nothing else is half-submitted, when they fill the fusion buffer, when
 * one of them is not a fusable collective, or when the oldest has waited
 * `cycle_ns`. When not, *wake_ns says when to ask again. */
bool hora__controller_should_send(const struct hora__controller *c, uint64_t now_ns,
                                  uint64_t cycle_ns, uint64_t fusion_threshold, uint64_t *wake_ns);

#endif
