"""Who gets which waiting message: the pure part of a bridge's queues."""

from gearhorn.stomp.queues.dispatch import Dispatch


class Sub:
    ack_timeout = None

    def __init__(self, name, prefetch=1):
        self.name, self.prefetch, self.held = name, prefetch, []

    def credit(self):
        return self.prefetch - len(self.held)


class Msg:
    def __init__(self, body):
        self.body = body
        self.consumer, self.redelivered, self.deliveries = None, False, 0

    def __repr__(self):
        return self.body


def deliver_all(dispatch, avoid=None):
    got = []
    for message, sub in dispatch.assignments(avoid):
        sub.held.append(message)
        got.append((message.body, sub.name))
    return got


def with_messages(*bodies, max_deliveries=0):
    dispatch = Dispatch(max_deliveries)
    dispatch.waiting.extend(Msg(b) for b in bodies)
    return dispatch


def test_messages_go_round_robin_to_subscribers_with_credit():
    dispatch = with_messages("m1", "m2", "m3", "m4", "m5")
    a, b = Sub("a", prefetch=2), Sub("b", prefetch=1)
    dispatch.add(a)
    dispatch.add(b)
    assert deliver_all(dispatch) == [("m1", "a"), ("m2", "b"), ("m3", "a")]
    assert [m.body for m in dispatch.waiting] == ["m4", "m5"]
    assert dispatch.credit() == 0 and dispatch.wanted() == -2


def test_grab_only_what_credit_leaves_unmet():
    dispatch = with_messages("m1")
    dispatch.add(Sub("a", prefetch=10))
    assert dispatch.wanted() == 9


def test_a_given_back_message_goes_first_to_someone_else_and_is_redelivered():
    dispatch = with_messages("m1", "m2")
    a, b = Sub("a"), Sub("b")
    dispatch.add(a)
    dispatch.add(b)
    deliver_all(dispatch)
    m1 = a.held.pop()
    dispatch.requeue(m1)
    b.held.clear()
    assert deliver_all(dispatch, avoid=a) == [("m1", "b")]
    assert m1.redelivered and m1.deliveries == 2


def test_the_avoided_subscriber_gets_it_when_no_one_else_can():
    dispatch = with_messages("m1")
    a = Sub("a")
    dispatch.add(a)
    assert deliver_all(dispatch, avoid=a) == [("m1", "a")]


def test_what_a_leaving_subscriber_held_comes_back_first_in_its_order():
    dispatch = with_messages("m1", "m2", "m3")
    a, b = Sub("a", prefetch=2), Sub("b", prefetch=0)
    dispatch.add(a)
    dispatch.add(b)
    deliver_all(dispatch)
    dispatch.remove(a)
    dispatch.requeue_all(a.held)
    assert [m.body for m in dispatch.waiting] == ["m1", "m2", "m3"]
    assert [m.redelivered for m in dispatch.waiting] == [True, True, False]
    b.prefetch = 3
    assert deliver_all(dispatch) == [("m1", "b"), ("m2", "b"), ("m3", "b")]


def test_a_message_is_exhausted_after_max_deliveries():
    dispatch = with_messages("m1", max_deliveries=2)
    a = Sub("a")
    dispatch.add(a)
    (message, _), = dispatch.assignments()
    assert not dispatch.exhausted(message)
    a.held.clear()
    dispatch.requeue(message)
    (message, _), = dispatch.assignments()
    assert dispatch.exhausted(message)
    assert not Dispatch(0).exhausted(message)  # 0: redeliver forever


def test_no_subscriber_no_assignment():
    dispatch = with_messages("m1")
    assert deliver_all(dispatch) == [] and len(dispatch.waiting) == 1
