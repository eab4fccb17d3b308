// The built-in English text the synthetic vocabulary's BPE merges are learned
// from. Original prose written for this purpose (no third-party text): common
// words, contractions, numbers, punctuation, a little code and a few accented
// words, so the learned tokens look like those of a real English vocabulary.
#include "bonsai/synth.h"

namespace bonsai {

std::string_view synth_training_text() {
  static constexpr std::string_view kText = R"TEXT(The Small Tree in the Window

A bonsai is not a kind of tree. It is a way of caring for a tree, slowly, over many years, so that it
stays small while it grows old. Almost any tree can become a bonsai: a pine, a maple, a juniper, an elm,
an olive or a fig. What matters is the patience of the person who keeps it, and the attention they pay
to water, light, soil and time.

Every morning, before the house woke up, my grandmother walked to the window where the little trees
stood in their shallow pots. She looked at each one for a long moment. Then she touched the soil with
the tip of her finger. If it was dry, she watered the tree until the water ran out of the holes at the
bottom of the pot. If it was still damp, she left it alone. "Most people kill their trees with
kindness," she told me. "They give them too much water, too much food, too much worry."

I didn't understand her at first. I thought that caring for something meant doing things for it,
always, every day. But she showed me that it often means waiting, watching, and doing nothing at all
until the moment is right. It's a lesson I've tried to remember ever since, and one I'll probably keep
learning for the rest of my life.

Questions people often ask

How old is the oldest tree? Some trees in private collections are said to be more than 500 years old,
and a few are thought to be over 1000. Nobody can be completely sure, because records were not kept.

How much does a good tree cost? A young tree from a garden shop might cost $20 or $30. A mature tree
with a fine trunk and a long history can sell for $10,000, $50,000 or even more.

Can I keep one indoors? Most trees need to live outside. They need cold winters, fresh air, rain and
strong sunlight. A few tropical species, such as the ficus, can live inside near a bright window.

When should I cut the branches? Prune in early spring, just before the buds open, or in late summer.
Don't remove more than a third of the leaves at once, and never cut the roots and the branches in the
same season.

A short conversation

"Are you going to the market today?" asked Sam.
"I was planning to," said Maria. "Why? Do you need something?"
"We're out of bread, milk and eggs. And could you get some apples? The red ones, not the green ones."
"Sure. Anything else?"
"No, that's all. Thank you! I'd go myself, but I've got to finish this report by five o'clock."
"It's no problem. I'll be back around noon. Don't forget to call your brother; he phoned twice."
"I know, I know. I'll call him after lunch."

A simple recipe for vegetable soup

You will need: 2 onions, 3 carrots, 4 potatoes, 1 small cabbage, 2 cloves of garlic, 1.5 litres of
water, 2 tablespoons of olive oil, salt and pepper.

1. Wash and peel the vegetables. Cut them into small pieces.
2. Heat the oil in a large pot over medium heat. Add the onions and the garlic and cook for 5 minutes.
3. Add the carrots, the potatoes and the cabbage. Stir well.
4. Pour in the water, bring it to the boil, then lower the heat.
5. Let the soup cook for 30 to 40 minutes, until the potatoes are soft.
6. Season with salt and pepper. Serve hot, with fresh bread.

The soup keeps for 3 days in the fridge. It tastes even better on the second day, when the flavours
have had time to come together.

How a computer reads a number

A computer stores everything as bits, the digits 0 and 1. Eight bits make a byte, and a byte can hold
256 different values, from 0 to 255. To store larger numbers, the computer uses several bytes together:
two bytes hold values up to 65535, and four bytes hold values up to 4294967295. Text is stored the same
way. Each letter, digit or symbol is given a number, and the number is stored in one or more bytes.

A program is a list of instructions. For example, the following lines add the numbers from 1 to 10:

    total = 0
    for i in range(1, 11):
        total = total + i
    print(total)  # prints 55

When the program runs, the computer follows the instructions one after another, very quickly. A modern
processor can perform billions of simple operations every second, but it still does exactly what it is
told, no more and no less. That is why programmers spend so much time testing their work.

A letter to a friend

Dear Thomas,

Thank you for your letter, which arrived on Tuesday. I was glad to hear that you and your family are
well, and that the new house is finally finished. You must be very happy to have a garden of your own
at last. Have you decided what you're going to plant?

Things here are quiet. The weather has been cold and wet for most of the month, so I've spent a lot of
time reading. I finished the book you sent me; I couldn't put it down. The ending surprised me, though
I think I should have seen it coming. We should talk about it when we meet.

We're hoping to visit you in the summer, perhaps in July or August, if that would suit you. Let me know
which weeks would be best. Until then, take care of yourself, and give my love to everyone.

With best wishes,
Anna

Notes on the weather

Monday: cloudy, with light rain in the afternoon. High of 14 degrees, low of 8.
Tuesday: bright and sunny, but windy near the coast. High of 17, low of 9.
Wednesday: heavy rain and strong winds, clearing in the evening.
Thursday: fog in the morning, then sunshine. Warmer than recent days.
Friday: showers, some of them heavy, with a chance of thunder.

Words that travel

English has borrowed many words from other languages. We eat in a café, we admire a façade, we read a
résumé, we meet a fiancée, and we try not to be naïve. Some of these words keep their accents, while
others lose them over the years, as people stop noticing that they came from somewhere else.

Why we learn

People learn because they are curious. A child asks why the sky is blue, why water is wet, why the moon
changes its shape, and why birds can fly while we cannot. Some of these questions have simple answers;
others have taken scientists hundreds of years to understand. The best teachers don't just give answers.
They help their students ask better questions, and they show them how to find out for themselves.

Learning is rarely easy. It takes practice, and practice means making mistakes. Every mistake is a chance
to notice something new: a rule we didn't know, a step we skipped, a word we misunderstood. Those who
are afraid of mistakes often stop trying, while those who accept them keep growing, a little at a time,
like a small tree in a window.

The town by the river

The town was built where two roads met beside a wide, slow river. For centuries, boats carried wood,
grain, wool and stone down to the sea, and brought back salt, cloth, tea and news from distant places.
The old bridge, made of grey stone, still stands, although cars now cross the river on a newer bridge
further north. On market days the square fills with stalls selling cheese, honey, flowers, fish and
fruit, and the cafés stay open late into the evening.

In the winter the river sometimes floods. The water rises over the banks and covers the fields, the
paths and the lower streets. People move their furniture upstairs, and the children are delighted,
because the school closes. When the water goes down, everyone helps to clean the mud from the houses.
The town has learned to live with its river, as it has for more than eight hundred years.

Everyday phrases

Good morning. Good afternoon. Good evening. Good night. How are you? I'm fine, thanks, and you? Not bad.
Please. Thank you very much. You're welcome. Excuse me. I'm sorry. What time is it? It's half past
three. Where is the station? It's on the left, next to the bank. How much is this? Can I pay by card?
Could you speak more slowly, please? I don't understand. What does this word mean? See you tomorrow!
Have a nice day. Happy birthday! Congratulations. Good luck. Well done. Never mind. Of course. Maybe later.

Common words

about above across after again against along already also although always among another answer any
anyone anything appear area around ask away back because become before begin behind believe below
best better between big black blue body both boy bring build business call came can car care carry case
cause change child children city class clear close cold come company complete consider continue could
country course cover create cut dark day decide deep develop different difficult direction door down
draw during each early earth easy eat economy education effect end enough even evening event ever every
example experience explain eye face fact family far fast father feel few field fight figure fill final
find fine fire first follow food foot force form forward free friend front full game general get girl
give go government great green ground group grow hand happen hard head health hear heart help here high
history hold home hope hour however human idea important include increase indeed industry information
inside instead interest island issue job join just keep kind know land language large last late later
laugh lead leave less level light like line listen little live local long look lose low machine make
man many matter may mean measure meet member mind minute money month more morning most mother move much
music must name nation natural near need never new next night north nothing notice now number object
offer office often old only open order other our out over own page paper part party pass past pay
people perhaps period person picture piece place plan plant play point police political poor possible
power present president pretty probably problem produce product program provide public pull push put
question quick quite race rather reach ready real reason receive record red remain remember report rest
result return right rise road rock room round rule run same save say school science sea second see seem
sell send sense serve service set several shall share short should show side sign simple since sing
sit size skin sleep slow small smile social society soft some someone something sometimes song soon
sound south space speak special spend stand star start state stay step still stop story street strong
student study such sudden summer sun support sure surface system table take talk teach team tell ten
test than that their them then there these they thing think those though thought three through throw
time today together too top toward town trade travel true try turn under until upon use usually valley
value various very view village visit voice wait walk wall want war warm watch water way wear week
weight well west what when where whether which while white whole why wide wife will wind window winter
wish with within without woman wonder wood word work world would write wrong year yellow yes yet young
)TEXT";
  return kText;
}

}  // namespace bonsai
